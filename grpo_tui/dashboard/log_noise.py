"""Library deprecation noise kept out of the Log tab (stdout.log itself keeps every line).

Python prints a warning as `FILE:LINE: FutureWarning: text`, then the source line of the `warnings.warn`
call, indented. transformers and TRL print several such lines at every start (`gradient_checkpointing is
deprecated ...`): they are about the libraries, not the run, and pushed the run's own lines out of view.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# A warning line of a deprecation category, as the warnings module formats it.
DEPRECATION_RE = re.compile(r"^\S.*:\d+: (?:FutureWarning|DeprecationWarning|PendingDeprecationWarning): ")


class DeprecationFilter:
    """Drops deprecation warnings and the indented source line that follows each; keeps the rest."""

    def __init__(self) -> None:
        self._after_warning = False  # the next line may be the warning's source line

    def keep(self, lines: Iterable[str]) -> list[str]:
        kept = []
        for line in lines:
            if DEPRECATION_RE.match(line):
                self._after_warning = True
                continue
            if self._after_warning and line.startswith((" ", "\t")):
                self._after_warning = False
                continue
            self._after_warning = False
            kept.append(line)
        return kept
