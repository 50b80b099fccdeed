"""Command lines built from a base and overrides, as tests build them: a flag given twice is an error
(core/recipe.py), so an override replaces the base's value instead of following it."""


def _spans(argv: list[str]) -> list[list[str]]:
    """`argv` cut at each `--flag` (its values with it); words before the first flag form their own span."""
    spans: list[list[str]] = []
    for word in argv:
        if word.startswith("--") or not spans:
            spans.append([word])
        else:
            spans[-1].append(word)
    return spans


def overriding(base: list[str], extra: list[str]) -> list[str]:
    """`base` with each flag of `extra` replacing the same flag (and its values) there; new flags appended."""
    spans = _spans(base)
    for span in _spans(extra):
        flag = span[0]
        index = next((i for i, s in enumerate(spans) if s[0] == flag and flag.startswith("--")), None)
        if index is None:
            spans.append(span)
        else:
            spans[index] = span
    return [word for span in spans for word in span]
