"""Every JSON output of the flashlab program is valid against its schema in docs/schemas/, and
each schema rejects broken documents: a required field removed, a field of the wrong type, a
value outside its enum or range, a field the schema does not name.

Usage: python3 cli_json_schemas.py path/to/flashlab path/to/docs/schemas
"""
import copy
import glob
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from json_schema import SchemaError, validate  # noqa: E402

flashlab, schemas = sys.argv[1], sys.argv[2]
failures = []


def schema(name):
    return os.path.join(schemas, f"{name}.schema.json")


def run(*args):
    subprocess.run([flashlab, *args], check=True, stdout=subprocess.DEVNULL)


def load(path):
    with open(path) as f:
        return json.load(f)


def expect_valid(name, document, label):
    errors = validate(schema(name), document)
    if errors:
        failures.append(f"{label}: not valid against {name}.schema.json: {errors[:3]}")


def expect_rejected(name, document, label, words):
    errors = validate(schema(name), document)
    if not errors:
        failures.append(f"{name}.schema.json accepts a broken document: {label}")
    elif not any(words in e for e in errors):
        failures.append(f"{name}.schema.json rejects {label}, but not for that: {errors[:3]}")


with tempfile.TemporaryDirectory() as work:
    out = lambda name: os.path.join(work, name)  # noqa: E731
    # --- real outputs, one or more of every command that writes JSON ---------------------------
    run("run", "--schedule", "fa2", "-n", "1024", "-d", "64", "--sram", "96K", "--machine", "h100", "--json", out("run.json"))
    run("run", "--schedule", "fa2_backward", "-n", "200", "-d", "40", "--sram", "16K", "--data", "--json", out("run_data.json"))
    run("run", "--schedule", "split_kv", "-n", "1024", "-d", "64", "--sram", "96K", "--splits", "3", "--json", out("run_split.json"))
    run("run", "--schedule", "split_kv", "-n", "1", "--seqlen-k", "1000", "--heads", "8", "--heads-kv", "2", "--sram", "96K",
        "--page-size", "100", "--page-reads", "whole_pages", "--json", out("run_paged.json"))
    run("run", "--schedule", "fa2_backward", "-n", "100", "-d", "16", "--heads", "8", "--heads-kv", "2", "--sram", "16K",
        "--dkv-reduction", "in_place", "--json", out("run_in_place.json"))
    run("sweep", "--schedules", "all", "--seqlens", "256,512,1024", "--head-dims", "64", "--sram", "1K,64K",
        "--masks", "none,causal", "--quiet", "--json", out("sweep.json"))
    run("sweep", "--schedules", "fa1,fa2", "--seqlens", "256,512,1024", "--head-dims", "64", "--machine", "a100",
        "--quiet", "--json", out("sweep_machine.json"))
    run("sweep", "--schedules", "fa1,standard", "--seqlens", "512", "--head-dims", "64", "--sram", "64K", "--block-rule", "paper",
        "--quiet", "--json", out("sweep_paper.json"))
    run("experiment", "--out-dir", work)
    run("figure2", "--json", out("figure2.json"))
    run("kernel-tiles", "--json", out("tiles.json"))
    run("kernel-tiles", "--machine", "h200", "--json", out("tiles_h200.json"))
    run("trace", "--schedule", "fa2", "--sram", "8K", "--causal", "--out", out("trace.json"))
    run("trace", "--schedule", "fa1_backward", "--sram", "8K", "--out", out("trace_backward.json"))
    run("search", "--schedule", "fa2", "-n", "1024", "-d", "64", "--machine", "h100", "--sram", "64K", "--multiple-of", "16",
        "--objective", "time", "--json", out("search.json"))
    run("search", "--schedules", "fa1,fa2", "-n", "300", "-d", "32", "--sram", "16K", "--causal", "--registers-per-thread", "64",
        "--json", out("search_orders.json"))
    run("ring", "--machine", "h200", "--devices", "4", "--seqlen-per-device", "2048", "--heads", "2", "--causal",
        "--json", out("ring.json"))
    run("ring", "--machine", "a100", "--sweep", "--sweep-devices", "2,4", "--heads", "2", "-d", "64", "--json", out("ring_sweep.json"))
    run("run", "--schedule", "ring_backward", "-n", "300", "-d", "32", "--sram", "32K", "--devices", "3", "--ordering", "striped",
        "--causal", "--json", out("run_ring.json"))
    with open(out("machines.json"), "w") as f:
        subprocess.run([flashlab, "machines", "--json"], check=True, stdout=f)
    run("hardware", "--kernel", "fa2", "--batch", "2", "--seqlen", "512", "--heads", "4", "--json", out("hardware.json"))
    run("hardware", "--kernel", "fa3", "--backward", "--batch", "1", "--seqlen", "300", "--heads", "2", "--head-dim", "64",
        "--causal", "--json", out("hardware_backward.json"))
    untimed = load(os.path.join(schemas, "..", "..", "sim", "machines", "h200.json"))
    untimed.pop("time_model")
    with open(out("h200_untimed.json"), "w") as f:
        json.dump(untimed, f)
    run("hardware", "--kernel", "fa1", "--seqlen", "256", "--machine", out("h200_untimed.json"), "--json", out("hardware_untimed.json"))

    outputs = {"run": ["run.json", "run_data.json", "run_split.json", "run_paged.json", "run_in_place.json", "run_ring.json"],
               "ring": ["ring.json", "ring_sweep.json"],
               "sweep": ["sweep.json", "sweep_machine.json", "sweep_paper.json"],
               "experiment": ["experiment.json"], "figure2": ["figure2.json"],
               "kernel-tiles": ["tiles.json", "tiles_h200.json"], "trace": ["trace.json", "trace_backward.json"],
               "machines": ["machines.json"], "search": ["search.json", "search_orders.json"],
               "hardware": ["hardware.json", "hardware_backward.json", "hardware_untimed.json"]}
    documents = {name: [load(out(f)) for f in files] for name, files in outputs.items()}
    for name, docs in documents.items():
        for file, document in zip(outputs[name], docs):
            expect_valid(name, document, file)
    # The inputs of the same shape: the machine presets.
    presets = glob.glob(os.path.join(schemas, "..", "..", "sim", "machines", "*.json"))
    assert presets, "no machine presets beside docs/schemas"
    for preset in presets:
        expect_valid("machines", [load(preset)], preset)
    # The outputs hold what the schemas' alternatives describe (else those parts went untested).
    sweep = documents["sweep"][0]
    assert {p["status"] for p in sweep["points"]} == {"ok", "does_not_fit"}, "sweep.json: both kinds of point"
    assert documents["sweep"][1]["machine"] is not None and sweep["machine"] is None
    paper = documents["sweep"][2]
    assert paper["block_rule"] == "paper" and [p["block_rule"] for p in paper["points"]] == ["paper", "fitting"]
    assert documents["run"][0]["bound"]["source"] == "FA1 Theorem 2"
    assert "errors" in documents["run"][1] and "roofline" in documents["run"][0]
    assert "num_splits" in documents["run"][2]["blocks"]
    assert documents["run"][3]["serving"]["page_reads"] == "whole_pages" and "page_table" in documents["run"][3]["counters"]["tensors"]
    assert "page_reads" not in documents["run"][2]["serving"] and documents["run"][4]["dkv_reduction"] == "in_place"
    assert documents["run"][5]["blocks"]["ordering"] == "striped" and documents["run"][5]["blocks"]["devices"] == 3
    assert "model" in documents["ring"][0] and "sweep" in documents["ring"][1]
    assert "seconds" in documents["search"][0]["best"] and documents["search"][1]["machine"] is None
    assert len(documents["search"][1]["rules"]) == 4 and documents["search"][1]["verification"]["closed_form_equal"]
    assert {e["kind"] for e in documents["trace"][0]["events"]} >= {"line", "load", "store", "compute", "free", "softmax_update"}
    assert documents["hardware"][0]["time"]["bound"] and documents["hardware"][2]["time"] is None
    assert documents["hardware"][1]["work"]["other_kernels"] == 2 and documents["hardware"][1]["l2"]["atomics"] > 0

    # --- broken documents: every schema must reject them -------------------------------------
    for name, docs in documents.items():
        good = docs[0]
        top = good if isinstance(good, dict) else good[0]
        broken = copy.deepcopy(top)
        broken.pop("format")  # required in every document
        expect_rejected(name, broken if isinstance(good, dict) else [broken], "the format removed", "required field")
        for label, change, words in [
            ("an unknown field", lambda d: d.__setitem__("surprise", 1), "not in the schema"),
            ("a wrong format", lambda d: d.__setitem__("format", "flashlab-other"), "is not"),
            ("version 2", lambda d: d.__setitem__("version", 2), "is not"),
        ]:
            broken = copy.deepcopy(top)
            change(broken)
            expect_rejected(name, broken if isinstance(good, dict) else [broken], label, words)
    expect_rejected("machines", [], "no presets", "fewer than 1")

    def mutated(name, change):
        document = copy.deepcopy(documents[name][0])
        change(document)
        return document

    expect_rejected("run", mutated("run", lambda d: d["counters"].__setitem__("hbm_bytes", "2101248")), "a count as a string",
                    "not of type integer")
    expect_rejected("run", mutated("run", lambda d: d["counters"].__setitem__("hbm_bytes", -1)), "a negative count", "minimum")
    expect_rejected("run", mutated("run", lambda d: d["counters"]["tensors"].__setitem__("Z", d["counters"]["tensors"]["Q"])),
                    "an unknown tensor", "not in the schema")
    expect_rejected("run", mutated("run", lambda d: d.__setitem__("memory", "cache")), "an unknown memory model", "not one of")
    expect_rejected("run", mutated("run", lambda d: d["roofline"].__setitem__("bound_by", "l2")), "an unknown roofline limit",
                    "not one of")
    expect_rejected("run", mutated("run", lambda d: d.__setitem__("closed_form_equal", 1)), "a number as a boolean",
                    "not of type boolean")
    expect_rejected("run", mutated("run", lambda d: d["blocks"].__setitem__("block_rows", 0)), "0-row blocks", "minimum")
    paged = copy.deepcopy(documents["run"][3])
    paged["serving"]["page_reads"] = "some_rows"
    expect_rejected("run", paged, "unknown page reads", "not one of")
    paged = copy.deepcopy(documents["run"][3])
    paged["serving"].pop("kv_bytes_per_token")
    expect_rejected("run", paged, "serving metrics without KV bytes per token", "required field")
    expect_rejected("sweep", mutated("sweep", lambda d: d["points"][0].pop("hbm_bytes")), "a counted point without its bytes",
                    "oneOf")
    first_unfit = next(i for i, p in enumerate(sweep["points"]) if p["status"] == "does_not_fit")
    expect_rejected("sweep", mutated("sweep", lambda d: d["points"][first_unfit].pop("reason")),
                    "a point that does not fit, without its reason", "oneOf")
    expect_rejected("sweep", mutated("sweep", lambda d: d["points"][0].__setitem__("status", "maybe")), "an unknown status",
                    "oneOf")
    expect_rejected("sweep", mutated("sweep", lambda d: d["points"][0].__setitem__("kept_fraction", 1.5)),
                    "a kept fraction above 1", "oneOf")
    expect_rejected("sweep", mutated("sweep", lambda d: d["fits"][0].__setitem__("variable", "B")), "a fit along an unknown variable",
                    "not one of")
    expect_rejected("sweep", mutated("sweep", lambda d: d.__setitem__("machine", "h100")), "a machine key instead of a preset",
                    "anyOf")
    expect_rejected("experiment", mutated("experiment", lambda d: d["crossover"]["rows"][0].__setitem__("fa2_bytes", -2)),
                    "a crossover count below -1", "minimum")
    expect_rejected("experiment", mutated("experiment", lambda d: d.__setitem__("machine", None)), "no machine",
                    "not of type object")
    expect_rejected("figure2", mutated("figure2", lambda d: d["rows"][0]["forward_blocks"].pop("block_cols")),
                    "blocks without Bc", "required field")
    expect_rejected("kernel-tiles", mutated("kernel-tiles", lambda d: d["tilings"][0].__setitem__("direction", "sideways")),
                    "an unknown direction", "not one of")
    expect_rejected("trace", mutated("trace", lambda d: d["events"][1].__setitem__("rows", [0])), "a range of one number",
                    "oneOf")
    expect_rejected("trace", mutated("trace", lambda d: d["events"][1].__setitem__("tensor", "Z")), "an unknown tensor",
                    "oneOf")
    expect_rejected("trace", mutated("trace", lambda d: d["problem"]["mask"].__setitem__("alignment", "middle")),
                    "an unknown causal alignment", "not one of")
    expect_rejected("machines", mutated("machines", lambda d: d[0].__setitem__("sram_bytes", 0)), "a machine without SRAM",
                    "minimum")
    expect_rejected("search", mutated("search", lambda d: d["rules"][0].__setitem__("rule", "guess")), "an unknown block rule",
                    "not one of")
    expect_rejected("search", mutated("search", lambda d: d["rules"][0].__setitem__("rank", 0)), "a rank of 0", "minimum")
    expect_rejected("search", mutated("search", lambda d: d["front"][0].pop("working_set_bytes")), "a front point without its working set",
                    "required field")
    expect_rejected("search", mutated("search", lambda d: d.__setitem__("front", [])), "an empty front", "fewer than 1")
    expect_rejected("hardware", mutated("hardware", lambda d: d["time"].__setitem__("bound", "hbm")), "an unknown bound",
                    "anyOf")
    expect_rejected("hardware", mutated("hardware", lambda d: d["l2"].pop("dram_read_bytes")), "no DRAM reads", "required field")
    expect_rejected("machines", mutated("machines", lambda d: [m for m in d if "gpu" in m][0]["gpu"].__setitem__("l2_partitions", 0)),
                    "an L2 of no partitions", "minimum")

    # --- the validator refuses a schema keyword it does not implement, instead of skipping it ---
    with open(out("unsupported.schema.json"), "w") as f:
        json.dump({"type": "object", "patternProperties": {"^x": {"type": "string"}}}, f)
    try:
        validate(out("unsupported.schema.json"), {"x": 1})
        failures.append("the validator accepted a schema with an unsupported keyword")
    except SchemaError:
        pass

for failure in failures:
    print("FAILED:", failure)
if failures:
    sys.exit(1)
print(f"{sum(len(v) for v in outputs.values())} outputs of {len(outputs)} kinds valid against docs/schemas/; broken documents rejected")
