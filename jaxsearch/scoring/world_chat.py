"""`WorldChatModel`: the chat model (config `kind: world`) behind SOAR's judges and R-Search's evidence reward
on the synthetic world. It knows only the world's facts and sentence templates (`data.world.oracle`)."""

from __future__ import annotations

import json
import re

from jaxsearch.data.world.oracle import read_answer
from jaxsearch.scoring import rewards
from jaxsearch.scoring.metrics import answer_in_text

OBSERVATION_TAGS = ("information", "knowledge")


class WorldChatModel:
    """A rule-based chat model for the synthetic world (config `kind: world`), behind the model-backed rewards.

    - SOAR's fabrication judge (system message `rewards.FABRICATION_JUDGE_PROMPT`): grounded when the
      trajectory's answer occurs in one of the observation blocks it is shown (E_ext only; `<information>`, or
      Graph-R1's `<knowledge>`), i.e. it was read, not invented.
    - SOAR's source-consistency judge (system message `rewards.SOURCE_CONSISTENCY_JUDGE_PROMPT`): consistent
      when the declared source's text supports the answer (`rewards.stream_supports`, the EM check's rule).
    - R-Search's evidence answerer (any other conversation, R-Search's evidence template): `read_answer`
      on the passages and question of the prompt, a reader that knows only the world's sentence templates.
    """

    def chat(
        self, batch: list[list[dict]], max_tokens: int, temperature: float, top_p: float = 1.0
    ) -> list[str]:
        return [self.reply(messages) for messages in batch]

    @staticmethod
    def reply(messages: list[dict]) -> str:
        system = messages[0]["content"] if messages[0]["role"] == "system" else None
        prompt = messages[-1]["content"]
        if system == rewards.FABRICATION_JUDGE_PROMPT:
            response = prompt.split("\n\nModel reasoning:\n", 1)[-1]
            answer = rewards.extract_answer(response)
            retrieved = [o for tag in OBSERVATION_TAGS for o in rewards.observations(response, tag)]
            grounded = bool(answer) and any(answer_in_text(o, [answer]) for o in retrieved)
            reason = (
                "the answer is in the retrieved information" if grounded else "the answer is not retrieved"
            )
            return json.dumps({"reason": reason, "grounded": grounded})
        if system == rewards.SOURCE_CONSISTENCY_JUDGE_PROMPT:
            case = re.search(
                r"\n\nFinal answer: (.*)\n\nDeclared source: .*\n\nSource text:\n(.*)", prompt, re.DOTALL
            )
            consistent = case is not None and rewards.stream_supports(case[2], case[1])
            return json.dumps({"reason": "rule: answer in the source text", "consistent": consistent})
        passages = re.search(r"given passages:\n(.*)\n\nQuestion: (.*)\nAnswer:", prompt, re.DOTALL)
        if passages is None:
            return ""
        return read_answer(passages[2], passages[1])
