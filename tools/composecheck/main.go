// composecheck validates a Compose file the way `docker compose config` does, with the same library
// (compose-spec/compose-go): schema, interpolation, anchors/merges and model checks. The test suite uses it when
// the docker client has no compose plugin (the machine has a docker client but no engine or plugin).
//
//	composecheck docker-compose.yaml         validate; print a one-line summary
//	composecheck -json docker-compose.yaml   validate; print the rendered project as JSON (like
//	                                         `docker compose config --format json`), for tests that check its facts
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/compose-spec/compose-go/v2/cli"
)

func main() {
	asJSON := flag.Bool("json", false, "print the rendered project as JSON")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: composecheck [-json] docker-compose.yaml")
		os.Exit(2)
	}
	path, err := filepath.Abs(flag.Arg(0))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	opts, err := cli.NewProjectOptions([]string{path}, cli.WithWorkingDirectory(filepath.Dir(path)),
		cli.WithOsEnv, cli.WithDotEnv, cli.WithInterpolation(true))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	project, err := opts.LoadProject(context.Background())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if *asJSON {
		out, err := project.MarshalJSON()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println(string(out))
		return
	}
	fmt.Printf("ok: project %q with %d services\n", project.Name, len(project.Services))
}
