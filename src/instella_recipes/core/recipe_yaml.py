"""A recipe file read as YAML, by itself: its mapping with the line of every top-level key, duplicate keys refused.
Below both `core.recipe` (the full parser) and `core.command_line` (the first checks before the slow imports), which
both read a recipe file; yaml only.
"""

import yaml

from .errors import RecipeError


def check_duplicate_keys(node, path) -> None:
    """A `RecipeError` naming `file:line` of the second occurrence of a key in any mapping of the YAML `node` tree
    (and the line of the first): YAML loaders keep the last value silently."""
    if isinstance(node, yaml.MappingNode):
        seen: dict = {}
        for key, value in node.value:
            name = key.value if isinstance(key, yaml.ScalarNode) else None
            if name is not None and name in seen:
                raise RecipeError(
                    f"{path}:{key.start_mark.line + 1}: duplicate key '{name}' (first at line {seen[name]}): keep one"
                )
            seen[name] = key.start_mark.line + 1
            check_duplicate_keys(value, path)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            check_duplicate_keys(item, path)


def load_yaml_text(text: str, path) -> tuple[object, object]:
    """`(data, node)` of a YAML document: `safe_load`'s value and the composed node tree (for line numbers), with
    duplicate keys refused (`check_duplicate_keys`). A syntax error is a `RecipeError` naming `path`."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise RecipeError(f"{path}: not valid YAML: {err}") from None
    check_duplicate_keys(node, path)
    return data, node


def recipe_mapping(path) -> tuple[dict, dict[str, int]]:
    """An existing recipe file's mapping and the line number of every top-level key (a RecipeError for invalid YAML,
    a duplicate key or a document that is not a mapping)."""
    data, node = load_yaml_text(path.read_text(), path)
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: a recipe must be a YAML mapping of argument names to values")
    lines = {key.value: key.start_mark.line + 1 for key, _ in node.value} if node is not None else {}
    return data, lines
