#!/usr/bin/env python3
"""//tests/e2e:prometheus_test: a real Prometheus scraping a local cluster.

deploy/local/cluster.sh starts a coordinator, a data loader and two CPU
workers, writes the file_sd target files deploy/prometheus/prometheus.yml
reads, and (--prometheus) starts Debian's Prometheus on that configuration and
deploy/prometheus/recfleet-rules.yml. The test submits a short job with
`recfleet submit` and, once it has ended, asks Prometheus's HTTP API:

- every target of the three scrape jobs is up, every rule loaded is healthy;
- every recording rule has data for the job over the time it ran (per-rank
  and per-phase rules: for every rank and every phase);
- every query of every panel of the Grafana dashboard
  (deploy/grafana/recfleet-training.json), with $job set to the job, has data.

No recording rule is exempt: CPU ranks export MFU against a nominal peak
(worker/worker_metrics.h), so the MFU rules have data without a GPU. One
dashboard query is (NO_DATA_EXPECTED, with the reason): the loader's queue
depth exists only while a rank's stream is open, and a short job's whole epoch
fits in gRPC's flow-control window, so its streams end within the first
second.
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

RUNFILES = os.path.join(os.environ["TEST_SRCDIR"], os.environ["TEST_WORKSPACE"])
TMP = os.environ.get("TEST_TMPDIR") or tempfile.mkdtemp()
CLUSTER = os.path.join(RUNFILES, "deploy/local/cluster.sh")
RECFLEET = os.path.join(RUNFILES, "cli/recfleet")
STEPS = 30
# Dashboard queries this job cannot give data to, and why.
NO_DATA_EXPECTED = {
    "recfleet_dataloader_queue_depth": "exists only while a stream is open; this job's epoch "
                                       "streams in well under one scrape interval",
}
failures = []


def check(ok, message):
    if not ok:
        failures.append(message)
        print("FAIL:", message, flush=True)


def read(rel):
    with open(os.path.join(RUNFILES, rel), encoding="utf-8") as f:
        return f.read()


def short_job_spec():
    """job-gemlite.yaml, as the README submits it, made short (fewer samples,
    smaller batches, fewer steps; about 15 s on a loaded 2-core machine),
    evaluated every 10 steps so the AUC panel has data."""
    text = read("deploy/examples/job-gemlite.yaml")
    edits = [
        (r"samples=60000", "samples=6000"),
        (r"\n  steps: 300\n", f"\n  steps: {STEPS}\n"),
        (r"\n  eval_every: 150\n", "\n  eval_every: 10\n"),
        (r"\n  checkpoint_every: 100\n", "\n  checkpoint_every: 15\n"),
        (r"\n  local_batch_size: 128\n", "\n  local_batch_size: 32\n"),
    ]
    for pattern, replacement in edits:
        text, n = re.subn(pattern, replacement, text)
        if n != 1:
            sys.exit(f"job-gemlite.yaml changed: '{pattern}' matched {n} times; update the test")
    return text


class Prometheus:
    def __init__(self, address):
        self.base = f"http://{address}/api/v1/"

    def get(self, path, **params):
        url = self.base + path + ("?" + urllib.parse.urlencode(params) if params else "")
        with urllib.request.urlopen(url, timeout=30) as r:
            body = json.load(r)
        if body.get("status") != "success":
            raise RuntimeError(f"{url}: {body}")
        return body["data"]

    def range_query(self, query, start, end):
        return self.get("query_range", query=query, start=f"{start:.3f}", end=f"{end:.3f}", step="1s")[
            "result"]


def cli(*args, timeout=60):
    return subprocess.run([RECFLEET, *args], capture_output=True, text=True, timeout=timeout)


def dump_logs(cluster_dir):
    for name in sorted(os.listdir(cluster_dir)):
        if name.endswith(".log"):
            with open(os.path.join(cluster_dir, name), errors="replace") as f:
                tail = f.read()[-3000:]
            print(f"----- {name} (tail) -----\n{tail}")


def run(cluster_dir):
    prom = Prometheus(open(os.path.join(cluster_dir, "prometheus.address")).read().strip())
    coordinator = open(os.path.join(cluster_dir, "coordinator.address")).read().strip()

    # The rules Prometheus loaded are the file's, all healthy.
    groups = prom.get("rules")["groups"]
    loaded = [r for g in groups for r in g["rules"]]
    recording = [r["name"] for r in loaded if r["type"] == "recording"]
    in_file = re.findall(r"^\s*- record:\s*(\S+)", read("deploy/prometheus/recfleet-rules.yml"), re.M)
    check(sorted(recording) == sorted(in_file),
          f"Prometheus loaded recording rules {sorted(recording)}, the file has {sorted(in_file)}")

    spec = os.path.join(TMP, "job-short.yaml")
    with open(spec, "w") as f:
        f.write(short_job_spec())
    start = time.time()
    submit = cli("submit", spec, "--coordinator", coordinator, "--json")
    check(submit.returncode == 0, f"recfleet submit: exit {submit.returncode}: {submit.stderr}")
    if submit.returncode != 0:
        return
    name = json.loads(submit.stdout)["name"]
    watch = cli("watch", name, "--coordinator", coordinator, timeout=240)
    check(watch.returncode == 0, f"recfleet watch {name}: exit {watch.returncode}: {watch.stdout}{watch.stderr}")
    # Two more evaluation intervals, so rules see the job's last scrapes.
    time.sleep(3)
    end = time.time()
    print(f"job {name} ran {end - start:.1f} s", flush=True)
    # The job as its series name it (recfleet_worker_task_info's recfleet_job).
    labels = prom.get("label/recfleet_job/values")
    check(labels == [name], f"recfleet_job label values {labels}, want ['{name}']")
    job_id = name

    # Every target up (coordinator, loader, both workers).
    targets = prom.get("targets")["activeTargets"]
    by_job = {}
    for t in targets:
        by_job.setdefault(t["labels"]["job"], []).append(t)
        check(t["health"] == "up", f"target {t['scrapeUrl']} is {t['health']}: {t.get('lastError')}")
    for job, count in (("recfleet-coordinator", 1), ("recfleet-dataloader", 1), ("recfleet-worker", 2)):
        check(len(by_job.get(job, [])) == count, f"scrape job {job}: {len(by_job.get(job, []))} targets, want {count}")
    # Rules evaluated without error (alerting rules included).
    for r in (r for g in prom.get("rules")["groups"] for r in g["rules"]):
        check(r["health"] == "ok", f"rule {r['name']}: health {r['health']}: {r.get('lastError')}")

    # Every recording rule: data for this job while it ran.
    for rule in in_file:
        result = prom.range_query(f'{rule}{{recfleet_job="{job_id}"}}', start, end)
        check(result, f"recording rule {rule} has no data for job {job_id}")
        if rule.startswith("recfleet_job_rank:"):
            ranks = sorted({s["metric"].get("rank") for s in result})
            check(ranks == ["0", "1"], f"{rule}: ranks {ranks}, want ['0', '1']")
        if "phase" in rule:
            phases = sorted({s["metric"].get("phase") for s in result})
            check(phases == ["comm", "compute", "data_wait"], f"{rule}: phases {phases}")
        if result:
            print(f"ok  {rule}: {len(result)} series, last {result[0]['values'][-1][1]}", flush=True)

    # Every dashboard query, as Grafana would send it for this job.
    dash = json.loads(read("deploy/grafana/recfleet-training.json"))

    def panels(ps):
        for p in ps:
            yield p
            yield from panels(p.get("panels", []))

    for p in panels(dash["panels"]):
        for t in p.get("targets", []):
            expr = t["expr"].replace("$job", job_id).replace("$rank", ".*")
            exempt = [why for metric, why in NO_DATA_EXPECTED.items() if metric in expr]
            if exempt:
                print(f"--  panel '{p['title']}': not checked: {exempt[0]}", flush=True)
                continue
            result = prom.range_query(expr, start, end)
            check(result, f"dashboard panel '{p['title']}': no data for {expr}")
            if result:
                print(f"ok  panel '{p['title']}': {t['expr'][:60]}", flush=True)


def main():
    cluster_dir = os.path.join(TMP, "cluster")
    started = subprocess.run(
        [CLUSTER, "start", cluster_dir, "--loader", "--workers", "2", "--bin", RUNFILES, "--data-root", TMP,
         "--prometheus", "--scrape-interval", "1s"],
        capture_output=True, text=True, timeout=120)
    print(started.stdout, started.stderr, flush=True)
    try:
        if started.returncode != 0:
            failures.append(f"cluster.sh start: exit {started.returncode}")
        else:
            run(cluster_dir)
    finally:
        subprocess.run([CLUSTER, "stop", cluster_dir], timeout=60)
    if failures:
        dump_logs(cluster_dir)
        print(f"{len(failures)} failure(s):\n" + "\n".join(failures))
        sys.exit(1)
    print("PASS")


if __name__ == "__main__":
    main()
