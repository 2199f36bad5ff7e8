"""The one error type for bad input: what the user gave, and can fix, is wrong.

Every error the tool raises for the user's input derives from `UserError`; the command line
prints it as one line with exit code 2. Any other exception is a bug in the tool.
"""

from __future__ import annotations

__all__ = ["UserError"]


class UserError(ValueError):
    """Bad input that the user can fix; the message says what to give instead."""
