#!/usr/bin/env python
"""Trains the example model shipped with llmkernels: a 4.6-million-parameter LLaMA that writes
English in the style of the Python documentation.

The model is small enough to live in the package (9 MB of bfloat16) and trained enough that its
text is readable and its attention heads have something to show. It is not a useful assistant.

Data: the reStructuredText sources of the Python 3.11 documentation (Debian's
``python3.11-doc``: ``/usr/share/doc/python3.11/html/_sources``; PSF License Version 2, the
code examples also Zero-Clause BSD), reduced to prose: directives, code blocks, tables and
comments dropped, roles (``:func:`len```) kept as their text. A quarter of the sections also
appear as one chat turn -- the user asks about the section's title, the assistant answers with
its first paragraph -- so the chat template means something.

Tokenizer: byte-level BPE (Hugging Face tokenizers), 4096 tokens, trained on the same text.
Model: transformers' LlamaForCausalLM -- dim 256, 6 layers, 8 query / 4 key-value heads,
SwiGLU hidden 512, RoPE theta 10000, tied embeddings, context 512. Training: AdamW (lr 2e-3,
cosine to 2e-4, warm-up 100 steps, weight decay 0.1), batches of 32 sequences of 256 tokens,
bfloat16 autocast; torch seed 0.

    apt-get install python3.11-doc          # the corpus
    pip install torch transformers tokenizers
    python examples/train_example_model.py --out python/llmkernels/_example_model \
        --minutes 40

Another torch version or host gives other weights; the tests only assert what any training
run gives (transformers and llmkernels agree on it; the text is words).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import time
from pathlib import Path

CORPUS = Path("/usr/share/doc/python3.11/html/_sources")
VOCAB = 4096
SPECIAL = ["<|bos|>", "<|eos|>", "<|user|>", "<|assistant|>", "<|end|>"]
# The chat template: one turn is "<|user|>\n{content}<|end|>\n", the reply follows
# "<|assistant|>\n" and ends with "<|end|>".
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'user' %}<|user|>\n{{ m['content'] }}<|end|>\n"
    "{% elif m['role'] == 'assistant' %}<|assistant|>\n{{ m['content'] }}<|end|>\n"
    "{% else %}{{ m['content'] }}\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

_ROLE = re.compile(r":[a-z:]+:`!?~?([^`<]*?)(?:\s*<[^>]*>)?`")
_LINK = re.compile(r"`([^`<]+?)\s*<[^>]+>`_+")
_LITERAL = re.compile(r"``([^`]+)``")
_REF = re.compile(r"`([^`]+)`_*")
_UNDERLINE = re.compile(r"^([=\-~^*#+\"'`.:_])\1{2,}\s*$")


_DIRECTIVE = re.compile(r"^\.\. ([a-z:-]+)::")
# directives whose bodies are code, markup or metadata; the others (function, class, note, ...)
# keep their body's prose
_SKIP = {
    "code-block", "code", "sourcecode", "doctest", "testcode", "testoutput", "testsetup",
    "testcleanup", "productionlist", "index", "toctree", "csv-table", "table", "list-table",
    "image", "figure", "literalinclude", "highlight", "raw", "only", "include", "module",
    "currentmodule", "moduleauthor", "sectionauthor", "program", "tabularcolumns",
    "audit-event-table", "audit-event", "opcode", "cmdoption", "option", "envvar", "c:function",
    "c:type", "c:macro", "c:member", "c:var", "impl-detail", "availability", "grammar-snippet",
}  # fmt: skip


def prose(text: str) -> list[tuple[str, list[str]]]:
    """An .rst file as [(section title, [paragraph, ...]), ...]: prose only."""
    lines = text.splitlines()
    sections: list[tuple[str, list[str]]] = [("", [])]
    para: list[str] = []
    skip_indent = -1  # inside a skipped directive, a literal block or a comment: its indentation
    options = False  # right after a kept directive: its ":option:" lines

    def flush() -> None:
        if para:
            p = " ".join(s.strip() for s in para)
            p = _LINK.sub(r"\1", _ROLE.sub(r"\1", p))
            p = _REF.sub(r"\1", _LITERAL.sub(r"\1", p)).replace("\\", "")
            p = re.sub(r"\s+", " ", p).strip()
            words = p.split()
            # sentences of words, not lists, tables, prompts or option summaries
            if (len(words) >= 8 and p[-1] in ".:?!)"
                    and not p.startswith(("|", "+", "*", "-", ">>>", "$", "#", "%"))):  # fmt: skip
                sections[-1][1].append(p.rstrip(":") + ("" if p.endswith(".") else "."))
            para.clear()

    for i, line in enumerate(lines):
        indent = len(line) - len(line.lstrip())
        stripped = line.strip()
        if skip_indent >= 0:
            if stripped and indent <= skip_indent:
                skip_indent = -1
            else:
                continue
        if options:
            if stripped.startswith(":") or (stripped and not para and indent > 0 and i and
                                            lines[i - 1].strip().endswith("::")):  # fmt: skip
                continue
            options = False
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if _UNDERLINE.match(stripped):
            flush()
            continue
        if stripped and _UNDERLINE.match(nxt.strip()) and len(nxt.strip()) >= len(stripped) - 2:
            flush()
            title = _LITERAL.sub(r"\1", _ROLE.sub(r"\1", stripped))
            sections.append((title.replace("\\", ""), []))
            continue
        if stripped.startswith(".."):
            flush()
            m = _DIRECTIVE.match(stripped)
            if m and m.group(1) not in _SKIP:
                options = True  # the body is prose: skip just the options
            else:
                skip_indent = indent
            continue
        if not stripped:
            flush()
            continue
        para.append(stripped)
        if stripped.endswith("::"):
            para[-1] = stripped[:-1] if not stripped[:-2].endswith(" ") else stripped[:-3]
            flush()
            skip_indent = indent
    flush()
    return [(t, ps) for t, ps in sections if ps]


def documents(corpus: Path, seed: int = 0) -> list[str]:
    """Training documents: each file's prose; a quarter of the sections also as a chat turn."""
    rng = random.Random(seed)
    docs: list[str] = []
    for path in sorted(corpus.rglob("*.rst.txt")):
        if path.parts[-2] in ("whatsnew", "c-api") or path.name.startswith(("license", "copyr")):
            continue
        sections = prose(path.read_text(encoding="utf-8", errors="replace"))
        body = []
        for title, paras in sections:
            if title:
                body.append(title)
            body.extend(paras)
            if title and rng.random() < 0.25 and len(title.split()) <= 8:
                ask = rng.choice(["What is {}?", "Tell me about {}.", "Explain {}.",
                                  "How does {} work?"])  # fmt: skip
                docs.append(f"<|user|>\n{ask.format(title.lower() if title.istitle() else title)}"
                            f"<|end|>\n<|assistant|>\n{paras[0]}<|end|>\n")  # fmt: skip
        if body:
            docs.append("\n\n".join(body))
    return docs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, default=CORPUS)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--minutes", type=float, default=40.0, help="training time budget")
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    if not args.corpus.is_dir():
        raise SystemExit(f"{args.corpus} not found: apt-get install python3.11-doc")

    import numpy as np
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    if args.threads:
        torch.set_num_threads(args.threads)
    docs = documents(args.corpus)
    text_chars = sum(map(len, docs))
    print(f"{len(docs)} documents, {text_chars / 1e6:.1f} M characters", flush=True)

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIAL, min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tok.train_from_iterator(docs, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<|bos|> $A", special_tokens=[("<|bos|>", tok.token_to_id("<|bos|>"))]
    )
    bos, eos = tok.token_to_id("<|bos|>"), tok.token_to_id("<|eos|>")
    end = tok.token_to_id("<|end|>")
    ids = []
    for d in docs:
        ids.append(bos)
        ids.extend(tok.encode(d, add_special_tokens=False).ids)
        ids.append(eos)
    data = torch.tensor(np.array(ids, dtype=np.int64))
    n_val = len(data) // 50
    train, val = data[:-n_val], data[-n_val:]
    print(f"{len(data) / 1e6:.2f} M tokens ({text_chars / len(data):.2f} characters each)",
          flush=True)  # fmt: skip

    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=6,
        num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=512,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True,
        bos_token_id=bos, eos_token_id=[eos, end], pad_token_id=eos,
    )  # fmt: skip
    model = LlamaForCausalLM(config)
    params = sum(p.numel() for p in model.parameters())
    print(f"{params / 1e6:.2f} M parameters", flush=True)
    seq, batch, lr, lr_min, warm = 256, 32, 2e-3, 2e-4, 100
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95))  # fmt: skip
    gen = torch.Generator().manual_seed(0)

    def batch_of(src: torch.Tensor) -> torch.Tensor:
        starts = torch.randint(0, len(src) - seq - 1, (batch,), generator=gen)
        return torch.stack([src[s : s + seq] for s in starts.tolist()])

    def evaluate() -> float:
        model.eval()
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            losses = [model(b, labels=b).loss.item()
                      for b in (val[i : i + seq].unsqueeze(0) for i in range(0, len(val) - seq, seq * 8))]  # fmt: skip
        model.train()
        return sum(losses) / len(losses)

    # estimate the steps that fit the budget from the first ones
    t0, step, total = time.time(), 0, None
    while True:
        elapsed = time.time() - t0
        if step == 20:
            total = max(200, int(args.minutes * 60 / (elapsed / 20)))
            print(f"{elapsed / 20:.2f} s a step: {total} steps", flush=True)
        if total is not None and step >= total:
            break
        horizon = total or 10_000
        f = step / warm if step < warm else 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warm) / max(1, horizon - warm))))
        for g in opt.param_groups:
            g["lr"] = lr * f if step < warm else lr_min + (lr - lr_min) * f
        b = batch_of(train)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(b, labels=b).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 50 == 0:
            print(f"step {step} loss {loss.item():.3f} ({time.time() - t0:.0f} s)", flush=True)
    val_loss = evaluate()
    print(f"validation loss {val_loss:.3f} nats ({math.exp(val_loss):.1f} perplexity)", flush=True)

    args.out.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(args.out, safe_serialization=True)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|eos|>",
                                   pad_token="<|eos|>", additional_special_tokens=SPECIAL[2:])  # fmt: skip
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(args.out)
    gen_cfg = {"bos_token_id": bos, "eos_token_id": [eos, end], "pad_token_id": eos,
               "do_sample": True, "temperature": 0.8, "top_p": 0.95}  # fmt: skip
    (args.out / "generation_config.json").write_text(json.dumps(gen_cfg, indent=2) + "\n")
    (args.out / "training.json").write_text(json.dumps({
        "steps": step, "seconds": round(time.time() - t0), "tokens": step * batch * seq,
        "corpus_tokens": len(data), "parameters": params, "validation_loss": round(val_loss, 4),
        "torch": torch.__version__,
    }, indent=2) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
