"""Before launch: a hub model that is not in the local cache must be downloadable from here.

Otherwise the run would fail 35-60 s in, deep in transformers' retries. The check costs nothing for a
cached model or a local path; for one that is not cached it decides offline when HF_HUB_OFFLINE says
so, else by trying to reach the hub for at most HUB_TIMEOUT_S. It only refuses: a reachable hub may
still lack the model, which transformers reports itself.
"""

from __future__ import annotations

import os
import socket
from functools import lru_cache
from urllib.parse import urlsplit

from grpo_tui.userinput import clip, user_path

# Seconds allowed to open a connection to the hub.
HUB_TIMEOUT_S = 3.0
# The file every transformers model repository has: its presence in the cache means the model is there.
PROBE_FILE = "config.json"
DEFAULT_ENDPOINT = "https://huggingface.co"
# Values of HF_HUB_OFFLINE that mean offline, as huggingface_hub reads them.
TRUE_VALUES = frozenset({"1", "on", "yes", "true"})


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in TRUE_VALUES


def model_cached(repo_id: str) -> bool:
    """Whether `repo_id`'s config is in the local hub cache (HF_HOME / HF_HUB_CACHE respected)."""
    try:
        from huggingface_hub import try_to_load_from_cache

        # The variable read now, not at huggingface_hub's import: the process may have set it since.
        cache_dir = os.environ.get("HF_HUB_CACHE") or None
        return isinstance(try_to_load_from_cache(repo_id, PROBE_FILE, cache_dir=cache_dir), str)
    except Exception:  # an id the hub library refuses: transformers would refuse it too, later
        return False


@lru_cache(maxsize=4)
def hub_reachable(endpoint: str, timeout: float = HUB_TIMEOUT_S) -> bool:
    """Whether a TCP connection to the hub's host opens within `timeout` seconds (asked once per process)."""
    parts = urlsplit(endpoint)
    host, port = parts.hostname, parts.port or (80 if parts.scheme == "http" else 443)
    if not host:
        return False
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def hub_model_problem(name: str, is_hub_id: bool) -> str | None:
    """One line when hub model `name` is neither cached nor downloadable now; None otherwise."""
    if not is_hub_id or user_path(name).exists() or model_cached(name):
        return None
    shown = clip(name)  # one line, whatever the name holds
    fix = f"download it first with `hf download {shown}` (or give a local folder)"
    if hub_offline():
        return f"model.name_or_path: {shown} is not in the local cache and HF_HUB_OFFLINE is set; {fix}"
    endpoint = os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT
    if not hub_reachable(endpoint):
        host = urlsplit(endpoint).hostname or endpoint
        return (
            f"model.name_or_path: {shown} is not in the local cache and the hub ({host}) is unreachable"
            f" within {HUB_TIMEOUT_S:.0f} s; {fix}"
        )
    return None
