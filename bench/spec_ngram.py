#!/usr/bin/env python3
"""Prompt-lookup speculative decoding at batch 1: decode tokens/s with and
without drafts, through the engine (`cinfer-run --spec-ngram K`).

Tasks on the default model (chat-wrapped prompts): `repeat` (repeat a
given text), `code` (return a function with one name changed), and
`fresh` (an open question whose answer copies nothing, so drafts are few
and mostly rejected: what speculation costs where it cannot help). For
each task and each K (0 = the engine without drafts), `--rounds` runs of
`-r --reps` generations each, the order of the K values rotating every
round; the table gives the median decode rate, the median ratio to K = 0
over the rounds (runs seconds apart: on a shared machine the ratio holds
better than either rate), drafts taken / verified, and steps. The text
must be the same for every K (it is checked: speculation changes nothing
but speed).

    bench/spec_ngram.py [--run build/release/tools/cinfer-run] [--k 0,4,8]
                        [--rounds 5] [--reps 3] [-n 128] [--threads 1]
                        [--out bench/results/spec-ngram.md]
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

TEXT = ("The committee met on Tuesday to review the budget for the coming "
        "year. After a long discussion, the members agreed to increase the "
        "funding for the public library by ten percent, to repair the roof "
        "of the town hall before the winter, and to hire two new teachers "
        "for the primary school. The proposal to build a new parking lot "
        "near the river was postponed until the spring, when the results "
        "of the environmental study will be known.")

CODE = '''def total_price(items, tax_rate):
    subtotal = 0
    for item in items:
        subtotal += item.price * item.quantity
    tax = subtotal * tax_rate
    return subtotal + tax


def print_receipt(items, tax_rate):
    for item in items:
        print(item.name, item.quantity, item.price)
    print("total", total_price(items, tax_rate))
'''

TASKS = {
    "repeat": "Repeat the following text exactly, word for word.\n\n" + TEXT,
    "code": ("Rename the function total_price to compute_total everywhere "
             "in this code and return the whole code.\n\n" + CODE),
    "fresh": "Name three animals that live in the ocean and say one thing "
             "about each.",
}


def run_once(run, model, prompt, n, k, reps, threads):
    """(text, [json rows]) of one cinfer-run call."""
    cmd = [run, "--chat", "-p", prompt, "-n", str(n), "--spec-ngram", str(k),
           "-r", str(reps), "-t", str(threads)]
    if model:
        cmd += ["-m", model]
    p = subprocess.run(cmd, check=True, text=True, capture_output=True)
    rows = [json.loads(l) for l in p.stderr.splitlines() if l.startswith("{")]
    return p.stdout, rows


def default_model():
    p = subprocess.run([os.path.join(ROOT, "scripts", "default-model.sh")],
                       text=True, capture_output=True)
    return p.stdout.strip() if p.returncode == 0 else ""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", default=os.path.join(ROOT, "build", "release",
                                                  "tools", "cinfer-run"))
    ap.add_argument("-m", "--model", default="")
    ap.add_argument("--k", default="0,4,8")
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="",
                    help="markdown file (default bench/results/spec-ngram.md)")
    a = ap.parse_args()
    ks = [int(x) for x in a.k.split(",")]
    if 0 not in ks:
        ks = [0] + ks
    model = a.model or default_model()
    if not model:
        sys.exit("spec_ngram.py: no model (-m, or scripts/default-model.sh)")
    tasks = a.tasks.split(",")
    res = {}
    for t in tasks:
        rates = {k: [] for k in ks}
        ratios = {k: [] for k in ks}
        info = {}
        texts = {}
        for r in range(a.rounds):
            order = ks[r % len(ks):] + ks[:r % len(ks)]
            med = {}
            for k in order:
                text, rows = run_once(a.run, model, TASKS[t], a.n, k, a.reps,
                                      a.threads)
                texts.setdefault(k, text)
                if texts[k] != text or texts[0 if 0 in texts else k] != text:
                    sys.exit("spec_ngram.py: %s: the text with K = %d differs"
                             % (t, k))
                tg = [x["tg_tps"] for x in rows]
                rates[k] += tg
                med[k] = statistics.median(tg)
                info[k] = rows[-1]
            for k in ks:
                ratios[k].append(med[k] / med[0])
            print("%s round %d: %s" % (t, r, " ".join(
                "k%d %.1f" % (k, med[k]) for k in ks)), file=sys.stderr)
        res[t] = (rates, ratios, info)
    lines = ["# Prompt-lookup speculative decoding, batch 1", "",
             "%s, `bench/spec_ngram.py --k %s --rounds %d --reps %d -n %d "
             "--threads %d`, default model, %s (%d CPUs online). The machine "
             "is shared with other work, so single rates are noisy; the "
             "ratio column is the median over rounds of K vs K = 0 run "
             "seconds apart. The text was the same for every K." % (
                 datetime.date.today().isoformat(), a.k, a.rounds, a.reps,
                 a.n, a.threads, benchlib.cpu_info()["model"],
                 benchlib.cpu_info()["cpus"]), "",
             "| task | K | decode tok/s (median) | vs K = 0 | drafts taken / "
             "verified | tokens | steps |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for t in tasks:
        rates, ratios, info = res[t]
        for k in ks:
            i = info[k]
            lines.append("| %s | %d | %.1f | %.2fx | %d / %d | %d | %d |" % (
                t, k, statistics.median(rates[k]),
                statistics.median(ratios[k]), i["spec_accepted"],
                i["spec_drafted"], i["n_gen"], i["steps"]))
    md = "\n".join(lines) + "\n"
    print(md)
    out = a.out or benchlib.current_result(
        os.path.join(ROOT, "bench", "results"), "spec-ngram", [".md"]) + ".md"
    with open(out, "w") as f:
        f.write(md)


if __name__ == "__main__":
    main()
