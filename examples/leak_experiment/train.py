#!/usr/bin/env python3
"""Leak experiment, one run: train a small byte-level Llama on packed kernel documentation with one
attention configuration (bf16, document, prefix, e2m1 or leaky; see attention.py), evaluating every
checkpoint's validation loss twice: through its own attention and through exact BF16 attention.

The model, the data order and the initialisation depend only on --seed, so runs of different
configurations with one seed see the same batches from the same starting weights. A run is
resumable: each evaluation writes <out>/checkpoint.pt (model, optimizer, schedule, data position,
RNG), and --max-steps-this-call stops early so a long run can be split over several GPU jobs.

Outputs in --out: metrics.jsonl (one JSON object per logged step or evaluation), checkpoint.pt,
run.json (the arguments and the final numbers).

  python3 examples/leak_experiment/train.py --data .carry/corpus --config document --seed 0 \\
      --out runs/document_s0 [--steps 1200] [--max-steps-this-call 600]
"""

import argparse
import json
import math
import pathlib
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402

import configs  # noqa: E402
import packing  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, type=pathlib.Path, help="corpus.py output folder")
    p.add_argument("--config", required=True, choices=tuple(configs.CONFIGS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, type=pathlib.Path)
    p.add_argument("--steps", type=int, default=1200, help="optimizer steps of the whole run")
    p.add_argument("--max-steps-this-call", type=int, default=0, help="stop (resumably) after this many steps")
    p.add_argument("--rows-per-step", type=int, default=16)
    p.add_argument("--row-tokens", type=int, default=2048)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--head-dim", type=int, default=64, choices=(64, 128))
    p.add_argument("--kv-groups", type=int, default=2, help="query heads per K/V head (GQA)")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--eval-every", type=int, default=200)
    p.add_argument("--eval-rows", type=int, default=0, help="validation rows per evaluation (0: all)")
    p.add_argument("--log-every", type=int, default=25)
    p.add_argument("--leak-block", type=int, default=32, help="the leaky controls' scale group / mask tile, in tokens")
    args = p.parse_args(argv)
    if args.width % args.head_dim or (args.width // args.head_dim) % args.kv_groups:
        p.error("--width must be a multiple of --head-dim, and the head count a multiple of --kv-groups")
    return args


def load_rows(data, split, row_tokens):
    """(ids uint8 [rows, L], positions int16 [rows, L]) of the split packed into rows."""
    text = np.fromfile(data / f"{split}.bin", dtype=np.uint8)
    rows = packing.pack(packing.read_offsets(data / f"{split}_offsets.bin"), row_tokens)
    ids = np.empty((len(rows), row_tokens), dtype=np.uint8)
    positions = np.empty((len(rows), row_tokens), dtype=np.int16)
    for r, row in enumerate(rows):
        at = 0
        for start, end in row:
            ids[r, at:at + end - start] = text[start:end]
            positions[r, at:at + end - start] = np.arange(end - start)
            at += end - start
    return ids, positions


def batch(torch, ids, positions, index, device):
    x = torch.from_numpy(ids[index].astype(np.int64)).to(device)
    pos = torch.from_numpy(positions[index].astype(np.int64)).to(device)
    labels = x.clone()
    labels[pos == 0] = -100  # a document's first byte is not predicted from the previous document
    return x, pos, labels


def build_model(torch, transformers, args, attn):
    heads = args.width // args.head_dim
    config = transformers.LlamaConfig(
        vocab_size=256, hidden_size=args.width, intermediate_size=(args.width * 8 // 3 + 63) // 64 * 64,
        num_hidden_layers=args.layers, num_attention_heads=heads, num_key_value_heads=heads // args.kv_groups,
        head_dim=args.head_dim, max_position_embeddings=args.row_tokens, rope_theta=10000.0,
        tie_word_embeddings=False, attn_implementation=attn)
    torch.manual_seed(args.seed)  # the same initial weights for every configuration
    return transformers.LlamaForCausalLM(config).cuda()


def evaluate(torch, model, val, attn, args):
    """Mean validation loss per predicted byte with attention implementation `attn`."""
    ids, positions = val
    rows = len(ids) if args.eval_rows <= 0 else min(args.eval_rows, len(ids))
    own = model.config._attn_implementation
    model.set_attn_implementation(attn)
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        for start in range(0, rows, args.rows_per_step):
            x, pos, labels = batch(torch, ids, positions, np.arange(start, min(start + args.rows_per_step, rows)), "cuda")
            logits = model(input_ids=x, position_ids=pos, use_cache=False).logits.float()
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 256), labels[:, 1:].reshape(-1),
                                                     ignore_index=-100, reduction="sum")
            total += loss.item()
            count += int((labels[:, 1:] != -100).sum())
    model.set_attn_implementation(own)
    model.train()
    return total / count


def lr_at(step, args):
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    progress = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def main(argv=None):
    args = parse_args(argv)
    import torch
    import transformers

    import attention

    names = attention.register_all(args.leak_block, args.row_tokens)
    own, reference = names[args.config], names[configs.REFERENCE]
    args.out.mkdir(parents=True, exist_ok=True)
    log = (args.out / "metrics.jsonl").open("a")

    def record(entry):
        log.write(json.dumps(entry) + "\n")
        log.flush()

    t0 = time.perf_counter()
    train = load_rows(args.data, "train", args.row_tokens)
    val = load_rows(args.data, "val", args.row_tokens)
    print(f"train: {len(train[0])} rows, val: {len(val[0])} rows of {args.row_tokens} bytes "
          f"({time.perf_counter() - t0:.1f} s)", flush=True)

    model = build_model(torch, transformers, args, own)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    order_rng = np.random.default_rng(args.seed)  # the data order: one permutation per epoch
    order, cursor, step = order_rng.permutation(len(train[0])), 0, 0
    checkpoint = args.out / "checkpoint.pt"
    if checkpoint.exists():
        state = torch.load(checkpoint, weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        order, cursor, step = state["order"], state["cursor"], state["step"]
        order_rng.bit_generator.state = state["order_rng"]
        print(f"resumed at step {step}", flush=True)
    params = sum(p.numel() for p in model.parameters())
    print(f"model: {params / 1e6:.1f} M parameters, attention {own}, reference {reference}", flush=True)

    def save():
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "order": order,
                    "cursor": cursor, "step": step, "order_rng": order_rng.bit_generator.state}, checkpoint)

    stop = args.steps if args.max_steps_this_call <= 0 else min(args.steps, step + args.max_steps_this_call)
    tokens, timed = 0, 0.0
    while step < stop:
        if cursor + args.rows_per_step > len(order):
            order, cursor = order_rng.permutation(len(train[0])), 0
        x, pos, labels = batch(torch, *train, order[cursor:cursor + args.rows_per_step], "cuda")
        cursor += args.rows_per_step
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, args)
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=x, position_ids=pos, labels=labels, use_cache=False).loss
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        timed += time.perf_counter() - start
        tokens += x.numel()
        step += 1
        if step % args.log_every == 0 or step == stop:
            entry = {"step": step, "train_loss": loss.item(), "grad_norm": float(grad_norm),
                     "tokens_per_s": tokens / timed, "lr": lr_at(step - 1, args)}
            record(entry)
            print(f"step {step}/{args.steps} loss {entry['train_loss']:.4f} |g| {entry['grad_norm']:.3f} "
                  f"{entry['tokens_per_s'] / 1e3:.1f}k tok/s", flush=True)
            tokens, timed = 0, 0.0
        if step % args.eval_every == 0 or step == args.steps:
            val_own = evaluate(torch, model, val, own, args)
            val_ref = evaluate(torch, model, val, reference, args)
            record({"step": step, "val_own": val_own, "val_ref": val_ref, "gap": val_ref - val_own})
            print(f"eval {step}: own {val_own:.4f}, reference {val_ref:.4f}, gap {val_ref - val_own:+.4f}", flush=True)
            save()
    if step % args.eval_every != 0 and step != args.steps:
        save()  # stopped between evaluations (--max-steps-this-call): resumable from here
    log.close()
    (args.out / "run.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                   "step": step, "done": step >= args.steps}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
