// composecheck validates a Compose file the way `docker compose config` does, with the same library
// (compose-spec/compose-go): schema, interpolation, anchors/merges and model checks. The test suite uses it when
// the docker client has no compose plugin (the machine has a docker client but no engine or plugin).
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/compose-spec/compose-go/v2/cli"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: composecheck docker-compose.yaml")
		os.Exit(2)
	}
	path, err := filepath.Abs(os.Args[1])
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
	fmt.Printf("ok: project %q with %d services\n", project.Name, len(project.Services))
}
