"""scripts/clients-spec.py: the view of docs/openapi.yaml that the clients are generated from.

    clients-spec.py docs/openapi.yaml OUT.json

The app's routes (/v1/accounts/...) and the effects (webhooks:), with the components they
reach, and every enum of strings opened: a value the document does not list yet (a new
subscription status, a new effect type) must pass through a generated client, never raise in
it, so an enum becomes a string whose known values are kept in its description and in
x-known-values. The admin API is left out: it is the console's, not an app's.
Deterministic: the same document gives the same bytes.
"""

import json
import sys

from ruamel.yaml import YAML

APP_PREFIX = "/v1/accounts/"


def open_enums(node):
    """Every string enum (with null, maybe) becomes a string that names its known values."""
    if isinstance(node, list):
        return [open_enums(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = {key: open_enums(value) for key, value in node.items()}
    values = node.get("enum")
    if isinstance(values, list) and all(v is None or isinstance(v, str) for v in values):
        known = [v for v in values if v is not None]
        del node["enum"]
        node["type"] = ["string", "null"] if None in values else "string"
        note = "Known values: " + ", ".join(known) + " (a client accepts others too)."
        described = node.get("description")
        node["description"] = f"{described} {note}" if described else note
        node["x-known-values"] = known
    return node


def refs(node, found):
    """The components a node names by $ref, as (section, name)."""
    if isinstance(node, list):
        for item in node:
            refs(item, found)
    elif isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/components/"):
            _, _, section, name = ref.split("/", 3)
            found.add((section, name))
        for value in node.values():
            refs(value, found)


def reachable(doc, roots):
    components = doc.get("components", {})
    seen, todo = set(), set()
    refs(roots, todo)
    while todo:
        item = todo.pop()
        if item in seen:
            continue
        seen.add(item)
        section, name = item
        refs(components[section][name], todo)
    return seen


def plain(node):
    """ruamel's mappings and sequences as plain dicts and lists (anchors resolved)."""
    if isinstance(node, dict):
        return {str(k): plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [plain(v) for v in node]
    return node


def main(source, out):
    yaml = YAML(typ="safe", pure=True)
    with open(source, encoding="utf-8") as f:
        doc = plain(yaml.load(f))
    paths = {p: item for p, item in doc["paths"].items() if p.startswith(APP_PREFIX)}
    webhooks = doc.get("webhooks", {})
    # Effect: the envelope of every effect, a type the app does not know included.
    envelope = {"$ref": "#/components/schemas/Effect"}
    keep = reachable(doc, [paths, webhooks, envelope])
    components = {}
    for section, items in doc["components"].items():
        if section == "securitySchemes":
            components[section] = items
            continue
        kept = {name: value for name, value in items.items() if (section, name) in keep}
        if kept:
            components[section] = kept
    view = {
        "openapi": doc["openapi"],
        "info": doc["info"],
        "servers": doc.get("servers", []),
        "security": doc.get("security", []),
        "paths": paths,
        "webhooks": webhooks,
        "components": components,
    }
    with open(out, "w", encoding="utf-8") as f:
        json.dump(open_enums(view), f, indent=2, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main(*sys.argv[1:3])
