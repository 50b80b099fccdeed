"""Held-out checks of what the tiny SFT / DPO recipes teach (used by the tests and the docs): greedy answers to
TinyWorld's held-out arithmetic problems, scored for the trained answer format and for the correct sum."""

import re

import torch

from instella_recipes.data.tiny_world import TinyWorld

ANSWER = re.compile(r"^(\d+) \+ (\d+) = (\d+)\. The answer is (\d+)\.$")


@torch.no_grad()
def arithmetic_scores(model, tokenizer, n: int = 20, max_new_tokens: int = 24) -> dict[str, float]:
    """`format`: share of answers that are exactly "a + b = c. The answer is c." followed by EOS;
    `operands`: share whose "a + b" copies the question's numbers; `correct`: share with the right sum."""
    model.eval()
    problems = TinyWorld().problems("eval")[:n]
    fmt = ops = correct = 0
    for p in problems:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": p["question"]}], add_generation_prompt=True, return_tensors="pt",
            return_dict=True,
        )["input_ids"]  # fmt: skip
        out = model.generate(
            ids, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )[0, ids.shape[1]:]  # fmt: skip
        ended = bool((out == tokenizer.eos_token_id).any())
        text = tokenizer.decode(out, skip_special_tokens=True).strip()
        match = ANSWER.match(text)
        a, b = [int(x) for x in re.findall(r"\d+", p["question"])[:2]]
        fmt += bool(match and ended)
        ops += bool(match and (int(match[1]), int(match[2])) == (a, b))
        correct += bool(match and int(match[4]) == p["answer"])
    return {"format": fmt / n, "operands": ops / n, "correct": correct / n}
