"""What a scan could not represent as plain references, variable by variable.

A scan never drops a variable quietly: each one that is skipped, or served another way than
byte-range references (decoded and inlined, stored in a documented encoding), is listed here
with the reason, so a user can see exactly what the virtual dataset holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Action = Literal["skipped", "inlined", "encoded", "attribute-skipped", "attribute-conflict"]
"""What was done with something plain references cannot express (``attribute-conflict``:
combine kept the first file's value of an attribute that differs between files)."""


@dataclass(frozen=True)
class ReportEntry:
    url: str
    variable: str
    action: Action
    reason: str

    def __str__(self) -> str:
        return f"{self.url}: {self.variable}: {self.action}: {self.reason}"
