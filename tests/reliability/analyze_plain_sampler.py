"""Compare the probe_plain_sampler.py result: python3 analyze_plain_sampler.py OUTDIR/result.json"""
import json
import sys

R = json.load(open(sys.argv[1]))["engines"]

def first_diff(a, b):
    for j, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return j
    return None if len(a) == len(b) else min(len(a), len(b))

def cmp_tokens(tag, A, B):
    bad = []
    for i, (a, b) in enumerate(zip(A, B)):
        j = first_diff(a, b)
        if j is not None:
            bad.append(f"prompt {i} token {j}")
    print(f"  {tag}: {'EQUAL' if not bad else 'DIVERGE ' + '; '.join(bad)}")

def samplers(w):
    out = {}
    for r in w:
        key = ("drafted" if any(r["num_draft_tokens"]) else "undrafted", r["sampler"])
        out[key] = out.get(key, 0) + 1
    return out

for ph in R["nospec"]:
    print(f"== {ph}")
    ns = R["nospec"][ph]
    for e in ("switch", "switch-block"):
        r = R.get(e, {}).get(ph)
        if r is None:
            continue
        if "error" in r:
            print(f"  {e}: ERROR {r['error']}"); continue
        if "error" in ns:
            print(f"  nospec ERROR {ns['error']}"); continue
        cmp_tokens(f"{e} vs nospec tokens", ns["tokens"], r["tokens"])
        print(f"  {e} sampler counts: {samplers(r['worker'])}")
        if r["logprobs"][0] is not None or ns["logprobs"][0] is not None:
            bad = []
            for i, (a, b) in enumerate(zip(ns["logprobs"], r["logprobs"])):
                if (a is None) != (b is None):
                    bad.append(f"p{i}: presence nospec={a is not None} {e}={b is not None}"); continue
                if a is None:
                    continue
                if len(a) != len(b):
                    bad.append(f"p{i}: len {len(a)} vs {len(b)}")
                for j, (da, db) in enumerate(zip(a, b)):
                    if set(da) != set(db) or any(abs(da[k] - db[k]) > 1e-4 for k in da):
                        bad.append(f"p{i} pos{j}: {da} vs {db}"); break
            print(f"  {e} logprobs vs nospec: {'EQUAL' if not bad else 'DIFF ' + '; '.join(bad[:6])}")
    if "switch" in R and "switch-block" in R and ph in R["switch"] and "error" not in R["switch"][ph] \
            and "error" not in R["switch-block"][ph]:
        cmp_tokens("switch vs switch-block", R["switch"][ph]["tokens"], R["switch-block"][ph]["tokens"])
for e in R:
    if "seeded" in R[e] and "seeded_again" in R[e] and "error" not in R[e]["seeded"]:
        cmp_tokens(f"{e} seeded vs seeded_again", R[e]["seeded"]["tokens"], R[e]["seeded_again"]["tokens"])
