"""//deploy/grafana:dashboard_test: recfleet-training.json against what the
fleet exports, so no panel can silently read nothing.

Checks: the JSON loads; the job and rank variables exist and read
recfleet_worker_task_info; every metric a panel reads is a recording rule of
deploy/prometheus/recfleet-rules.yml or a series some recfleet service
registers (its name appears as a string literal in the exporters' sources);
every per-job series is filtered by $job; the provisioning files point at a
Prometheus data source and a dashboards folder.
"""
import json
import os
import re
import sys

root = os.path.join(os.environ["TEST_SRCDIR"], os.environ["TEST_WORKSPACE"])
failures = []


def fail(msg):
    failures.append(msg)


def read(rel):
    with open(os.path.join(root, rel), encoding="utf-8") as f:
        return f.read()


dash = json.loads(read("deploy/grafana/recfleet-training.json"))
rules = set(re.findall(r"^\s*- record:\s*(\S+)", read("deploy/prometheus/recfleet-rules.yml"), re.M))
exported = set()
for src in sys.argv[1:]:
    text = read(src)
    exported |= set(re.findall(r'"(recfleet_[a-z0-9_]+|process_[a-z0-9_]+)"', text))
if len(rules) < 5 or len(exported) < 20:
    fail(f"too few rules ({len(rules)}) or exported names ({len(exported)}) found: inputs moved?")

variables = {v["name"]: v for v in dash.get("templating", {}).get("list", [])}
for name in ("datasource", "job", "rank"):
    if name not in variables:
        fail(f"dashboard variable ${name} is missing")
for name in ("job", "rank"):
    q = variables.get(name, {}).get("definition", "")
    if "recfleet_worker_task_info" not in q:
        fail(f"${name} should list values of recfleet_worker_task_info, reads: {q!r}")

SUFFIXES = ("_bucket", "_sum", "_count")
titles = set()
for panel in dash["panels"]:
    title = panel.get("title", "?")
    titles.add(title)
    targets = panel.get("targets", [])
    if not targets:
        fail(f"panel {title!r} has no query")
    for t in targets:
        expr = t.get("expr", "")
        names = set(re.findall(r"\b((?:recfleet|process)_[a-zA-Z0-9_:]+)", expr))
        if not names:
            fail(f"panel {title!r}: no recfleet series in {expr!r}")
        for n in names:
            base = n
            for s in SUFFIXES:
                if n.endswith(s) and n[: -len(s)] in exported:
                    base = n[: -len(s)]
            if n not in rules and base not in exported:
                fail(f"panel {title!r} reads {n!r}: neither a recording rule nor an exported series")
        per_job = any(n.startswith(("recfleet_job:", "recfleet_job_rank:", "recfleet_worker_"))
                      or n.startswith("recfleet_dataloader_straggler")
                      or n.startswith("recfleet_dataloader_queue") for n in names)
        if per_job and '$job' not in expr:
            fail(f"panel {title!r}: per-job query not filtered by $job: {expr!r}")

for want in ("Samples/s per job", "MFU per job (local and E2E)", "Step time by phase (fraction)",
             "Straggler gap", "Training loss", "Eval AUC / NE"):
    if want not in titles:
        fail(f"no panel {want!r}")

ds = read("deploy/grafana/provisioning/datasources/recfleet.yaml")
if "type: prometheus" not in ds:
    fail("the datasource provisioning file does not declare a prometheus data source")
db = read("deploy/grafana/provisioning/dashboards/recfleet.yaml")
if "type: file" not in db or "path:" not in db:
    fail("the dashboard provisioning file does not load dashboards from a path")

if failures:
    for f in failures:
        print("dashboard_test: " + f, file=sys.stderr)
    sys.exit(1)
print(f"dashboard_test: {len(dash['panels'])} panels, {len(rules)} rules, "
      f"{len(exported)} exported names checked")
