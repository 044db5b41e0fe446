"""What shapes a summary: the chat model, the instruction, the text read, the answer's length.

All of it is in the summarize stage's key, so editing the prompt (or any other part) redoes
exactly the summaries and nothing the other stages made (ADR 0107).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from replayable.knobs import DEFAULT_PROMPT as DEFAULT_PROMPT
from replayable.knobs import DEFAULTS

if TYPE_CHECKING:
    from replayable.settings import PipelineSettings


@dataclass(frozen=True)
class SummaryConfig:
    """The summarize stage's key config."""

    model: str
    prompt: str = DEFAULT_PROMPT
    input_chars: int = DEFAULTS["summary_input_chars"]
    max_tokens: int = DEFAULTS["summary_max_tokens"]
    # Store an answer cut off at max_tokens (marked truncated) instead of failing its item
    # (ADR 0134). In the key only when set: a kept cut answer is never another run's summary,
    # and the summaries made before the option keep their keys.
    keep_truncated: bool = False

    def key(self) -> dict[str, Any]:
        found: dict[str, Any] = {
            "model": self.model,
            "prompt": self.prompt,
            "input_chars": self.input_chars,
            "max_tokens": self.max_tokens,
        }
        if self.keep_truncated:
            found["keep_truncated"] = True
        return found


def summary_config_of(settings: PipelineSettings, model: str) -> SummaryConfig:
    """The summarize stage's key config under a run's settings and the chat ``model`` the run
    resolved."""
    return SummaryConfig(
        model=model,
        prompt=settings.summary_prompt,
        input_chars=settings.summary_input_chars,
        max_tokens=settings.summary_max_tokens,
        keep_truncated=settings.summary_keep_truncated,
    )
