"""The files ``dcut-drafter train`` writes beside the checkpoint: the training curve (CSV and plot)
and the card ``README.md``, each atomically (the folder is swapped in whole by
:func:`~dcut_sched.drafters.workdir.replace_folder`).
"""

from __future__ import annotations

from pathlib import Path


def write_curve(path: Path, history) -> None:
    import pandas as pd

    from ..util.atomic import atomic_write_text

    atomic_write_text(path, pd.DataFrame(history).to_csv(index=False))


def plot_curve(path: Path, history, evals) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    from ..util.atomic import atomic_path

    h = pd.DataFrame(history)
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.5))
    for b, g in h.groupby("block_size"):
        ax[0].plot(g["step"], g["loss"].rolling(20, min_periods=1).mean(), label=f"B={b} (20-step mean)")
    ax[0].set_xlabel("step")
    ax[0].set_ylabel("weighted block cross-entropy (train)")
    ax[0].legend()
    if evals:
        e = pd.DataFrame(evals)
        for c in [c for c in e.columns if c.startswith("tau_")]:
            ax[1].plot(e["step"], e[c], marker="o", label=c.replace("tau_b", "B="))
    ax[1].set_xlabel("step")
    ax[1].set_ylabel("held-out tau (subset)")
    ax[1].legend()
    fig.tight_layout()
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)


def write_card(path: Path, meta: dict) -> None:
    from ..util.atomic import atomic_write_text

    s, c = meta["settings"], meta["config"]
    lines = [
        "# DFlash drafter for SmolLM2-135M-Instruct",
        "",
        "Written by `dcut-drafter train`; docs/drafters.md explains the architecture and the objective.",
        "",
        "## Command",
        "",
        f"    {meta['command']}",
        "",
        f"seed {s['seed']}; {meta['torch_threads']} torch threads on {meta['machine']}; "
        f"data {meta['data_seconds']} s, training {meta['train_seconds']} s, whole command {meta['wall_seconds']} s "
        f"(1-min load average at the end {meta['load_at_end']:.2f}).",
        "",
        "## Model",
        "",
        f"- {c['num_layers']} Qwen3-type decoder layers, width {c['hidden_size']}, {c['num_heads']} heads "
        f"({c['num_kv_heads']} KV), MLP {c['intermediate_size']}; {c['params'] / 1e6:.2f} M own parameters.",
        f"- context features: target layers {c['target_layer_ids']} (their output hidden states), "
        f"{c['feature_size']} wide, projected by `fc`.",
        f"- mask token id {c['mask_token_id']}; trained at block sizes {s['block_sizes']}.",
        "- token embedding: the target's (read at run time, not stored); LM head: "
        + ("the target's." if not c.get("draft_vocab_size") else
           f"the drafter's own over a {c['draft_vocab_size']}-token draft vocabulary (the most frequent tokens of "
           "the training continuations; `d2t` maps them to target ids), started from the target's rows."),
        "",
        "## Data",
        "",
        f"- train: {meta['train_sequences']} continuations ({meta['train_tokens']} tokens, prompt included) of "
        f"conversations by source {meta['data_stats']['by_source']} ({meta['data_stats']['two_turn']} of two turns; "
        "docs/drafters.md, \"Data\"), each turn continued by the target greedily and at "
        f"T = {s['temperature']} for up to {s['max_new_tokens']} tokens; data sha256 {meta['data_sha256'][:16]}.",
        f"- held out: {meta['eval_sequences']} continuations of {meta['eval_prompts']} "
        "and the 33 HumanEval problems whose index is a multiple of 5, and those of the 60 prompts of "
        "prompts-unlike.jsonl (twelve kinds absent from training), "
        + (f"the first {s['max_eval_prompts']} of each set (--max-eval-prompts), " if s.get("max_eval_prompts") else "")
        + f"greedy and sampled the same way for up to {s['eval_max_new_tokens']} tokens. No training prompt shares "
        "text or a template with them.",
        "",
        "## Training",
        "",
        f"{s['steps']} AdamW steps, lr {s['lr']} (warm-up {s['warmup_steps']}, then "
        f"{'cosine to 10 %' if s.get('lr_schedule', 'cosine') == 'cosine' else 'constant'}), "
        f"{s['seqs_per_step']} sequences x {s['blocks_per_seq']} random anchors per step; layers initialised "
        f"{'from the target' + chr(39) + 's top layers' if s.get('init') == 'target' else 'at random'}; loss "
        f"`{s.get('loss', 'ce')}` with DFlash's decaying slot weights (docs/drafters.md, Losses). One training "
        f"conversation in {s.get('calibration_every', 10)} is held back for calibration. Weights shipped in "
        f"bfloat16 (the figures below are those weights'). Curve: `training_curve.csv`, `training_curve.png`.",
        "",
        "## Held-out tau (1 + mean accepted drafts per block, every anchor of every held-out continuation)",
        "",
    ]
    for title, taus in (("held-out set", meta["tau"]), ("unlike set", meta.get("tau_unlike", {}))):
        if not taus:
            continue
        cats = sorted({k for v in taus.values() for k in v})
        lines += [f"{title}:", "", "| block / continuation | " + " | ".join(cats) + " |", "|---|" + "---|" * len(cats)]
        for key, v in taus.items():
            lines.append(f"| {key} | " + " | ".join(f"{v.get(k, float('nan')):.3f}" for k in cats) + " |")
        lines.append("")
    lines += ["", "Greedy continuations give greedy verification's acceptance; T = 0.7 continuations that of "
              "sampled verification with the same draws.", ""]
    depth = meta.get("depth_acceptance", {})
    if depth:
        lines += ["## Per-depth acceptance: P(accepted length >= d)", "",
                  "| set / block / continuation | " + " | ".join(f"d={d}" for d in range(1, 8)) + " |",
                  "|---|" + "---|" * 7]
        lines += [f"| {k} | " + " | ".join(f"{x:.3f}" for x in v[:7]) + " |" for k, v in depth.items()]
        lines.append("")
    ece = meta.get("calibration_ece", {})
    if ece:
        lines += ["## Calibration (`calibration.json`: per-depth prior fitted on the calibration split)", "",
                  "Expected calibration error of the draft confidences on the reached slots of fully verified "
                  "blocks, greedy and T = 0.7 continuations together, raw and through the prior:", "",
                  "| split | reached slots | ECE raw | ECE calibrated |", "|---|---:|---:|---:|"]
        lines += [f"| {k} | {v['reached']} | {v['ece_raw']:.3f} | {v['ece_calibrated']:.3f} |" for k, v in ece.items()]
        lines.append("")
    atomic_write_text(path, "\n".join(lines))
