"""Helpers for the graphs TensorFlow executed (partition graphs' node lists)."""

from typing import Any


def ancestors(nodes: dict[str, Any], name: str) -> set[str]:
    """Every node `name` waits for in an executed graph, through data and control inputs."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        for i in nodes[todo.pop()].input:
            source = i.lstrip("^").split(":")[0]
            if source in nodes and source not in seen:
                seen.add(source)
                todo.append(source)
    return seen
