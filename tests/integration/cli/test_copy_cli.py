"""``shoal copy`` as an operator runs it: a summary on success, one line naming the cluster on failure."""

from __future__ import annotations

import json

import yaml

from tests.copy_helpers import shoal


def test_copy_prints_a_summary_and_the_target_matches(source_cluster, target_cluster, unique_name):
    topic = unique_name()
    source_cluster.create_topic(topic, partitions=3)
    source_cluster.produce(topic, [(b"k%d" % i, b"v%d" % i) for i in range(300)], **{"compression.type": "zstd"})
    result = shoal("copy", "--source", "source", "--target", "target", "--topic", topic,
                   "--target-topic", f"dr.{topic}", "--partitions", "0-2")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "copied 300 records" in result.stdout and "(0 deep)" in result.stdout
    src, tgt = source_cluster.read_all(topic), target_cluster.read_all(f"dr.{topic}")
    assert [(r.partition, r.offset, r.content()) for r in tgt] == [(r.partition, r.offset, r.content()) for r in src]


def test_wrong_password_is_one_line_naming_the_cluster(sandbox, tmp_path):
    secure = json.loads((sandbox.broker("source").info_file).read_text())["secure"]
    settings = {"bootstrap.servers": secure["bootstrap"], "security.protocol": "SASL_SSL",
                "sasl.mechanism": secure["sasl.mechanism"], "sasl.username": "shoal",
                "sasl.password": "definitely-wrong", "ssl.ca.location": secure["ssl.ca.location"]}
    config = tmp_path / "prod-eu.yaml"
    config.write_text(yaml.safe_dump(settings))
    result = shoal("copy", "--source", str(config), "--target", "target", "--topic", "anything")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "cluster 'prod-eu'" in result.stderr and "authentication failed" in result.stderr
    assert "definitely-wrong" not in result.stderr + result.stdout


def test_bad_arguments_are_one_line_errors(source_cluster, unique_name):
    topic = unique_name()
    source_cluster.create_topic(topic)
    for args, expected in [
        (("--topic", "no.such.topic"), "topic 'no.such.topic' does not exist on cluster 'source'"),
        (("--topic", topic, "--from", "yesterday"), "--from 'yesterday' is not earliest, latest"),
        (("--topic", topic, "--partitions", "7"), "no partition 7"),
    ]:
        result = shoal("copy", "--source", "source", "--target", "target", *args)
        assert result.returncode == 2, result.stderr
        assert expected in result.stderr.replace("\n", " ") and "Traceback" not in result.stderr


def test_coalescing_small_batches_copies_one_record_batches_in_few_batches(source_cluster, target_cluster,
                                                                          unique_name):
    """``--coalesce-small-batches``: 400 one-record batches reach the target in a handful of batches, every record
    at its source offset (mode none: no markers) with key, value, headers and timestamp; the summary counts them."""
    from tests.copy_helpers import raw_batches

    topic = unique_name()
    source_cluster.create_topic(topic)
    source_cluster.produce(topic, [(b"k%d" % i, b"v%d" % i) for i in range(400)], partition=0,
                           **{"batch.num.messages": 1, "linger.ms": 0})
    assert len(raw_batches(source_cluster, topic)) == 400
    result = shoal("copy", "--source", "source", "--target", "target", "--topic", topic, "--target-topic",
                   f"dr.{topic}", "--mode", "none", "--coalesce-small-batches", "8192")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "copied 400 records" in result.stdout
    assert "400 source batches coalesced into larger ones" in result.stdout.replace("\n", " ")
    merged = raw_batches(target_cluster, f"dr.{topic}")
    assert len(merged) <= 10 and all(v.size <= 8192 for v in merged), [v.size for v in merged]
    src, tgt = source_cluster.read_all(topic), target_cluster.read_all(f"dr.{topic}")
    assert [(r.offset, r.content()) for r in tgt] == [(r.offset, r.content()) for r in src]


def test_a_tls_file_that_is_not_there_is_one_line_naming_the_cluster(sandbox, tmp_path):
    """The source's admin client is made first (it connects while the copy's own clients bootstrap); librdkafka
    refusing its settings there printed a stack trace."""
    config = tmp_path / "prod-us.yaml"
    config.write_text(yaml.safe_dump({"bootstrap.servers": "localhost:1", "security.protocol": "SSL",
                                      "ssl.ca.location": str(tmp_path / "no-such-ca.pem")}))
    result = shoal("copy", "--source", str(config), "--target", "target", "--topic", "anything", "--link-mbps", "20")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stderr.count("shoal: error:") == 1, result.stderr   # one message (wrapped to the terminal)
    message = " ".join(result.stderr.split())
    assert f"cluster 'prod-us': no such file: ssl.ca.location {tmp_path / 'no-such-ca.pem'}" in message, message
