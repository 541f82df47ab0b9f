"""R-Search's own evaluation loop as a protocol, `rsearch_eval` (QingFei1/R-Search `src/eval/main.py` and
`src/eval/config.yaml`): for evaluating the authors' checkpoints with their tags `<observation>` and
`<original_evidence>` (the `rsearch` protocol renames them for our rewards). Registered when this module is
imported (`agent.build` imports it: every command that builds an agent knows it).

    protocol = get_protocol("rsearch_eval")      # launch/eval.py --protocol rsearch_eval
"""

from __future__ import annotations

import re

from jaxsearch.agent import parsing
from jaxsearch.agent.protocols import Action, RSearchProtocol, register_protocol
from jaxsearch.retrieval.base import Doc

# R-Search's evaluation prompt (src/eval/config.yaml prompt.R-Search), with the authors' tag names
RSEARCH_EVAL_SYSTEM_PROMPT = (
    "You are a helpful assistant that can solve the given question step by step. For each step, start by "
    "explaining your thought process. If additional information is needed, provide a specific query enclosed "
    "in <search> and </search>. The system will return the top search results within <observation> and "
    "</observation>. You can perform multiple searches as needed.\n"
    "When you know the final answer, use <original_evidence> and </original_evidence> to provide all "
    "potentially relevant original information from the observations. Ensure the information is complete and "
    "preserves the original wording without modification. If no searches were conducted or observations were "
    "made, you can skip the summary step. Finally, provide the final answer within <answer> and </answer> tags."
)


@register_protocol("rsearch_eval")
class RSearchEvalProtocol(RSearchProtocol):
    """R-Search's own evaluation loop (QingFei1/R-Search `src/eval/main.py` `R_Search`), for its checkpoints:
    the authors' tags `<observation>` / `<original_evidence>` and their evaluation prompt (config.yaml).

    A call stops only at `</search>` (the six stop strings of main.py all contain it), EOS or its token budget
    (`--max_tokens` 1,024: the evaluation's max_segment_tokens). A segment that stopped at `</search>` gets the
    top-k of its last `<search>` block in `<observation>`, or an empty `<observation></observation>` when it
    has none (main.py `search_results = ''`; here the invalid-action hint). Any other segment ends the episode:
    the answer is its last `<answer>` block, else the whole segment stripped (main.py `answer=response`).
    There is no turn cap (main.py's `cnt > 4` break is commented out): give the evaluation max_turns past
    what the cache can hold.
    """

    name = "rsearch_eval"
    stop_strings = ("</search>",)
    segment_tags = {
        "<search>": "search",
        "<observation>": "information",
        "<original_evidence>": "evidence",
        "<answer>": "answer",
    }
    system_prompt = RSEARCH_EVAL_SYSTEM_PROMPT
    observation_tag = "observation"

    def parse_action(self, segment_text: str) -> Action:
        if "</search>" in segment_text:
            queries = re.findall(r"<search>(.*?)</search>", segment_text, re.DOTALL)  # main.py get_query
            return Action("search", queries[-1]) if queries else Action("invalid", "")
        answers = re.findall(r"<answer>(.*?)</answer>", segment_text, re.DOTALL)
        if answers:
            return Action("answer", answers[-1].strip())
        # vLLM's text holds no special tokens (skip_special_tokens): the segment's EOS is not the answer's
        return Action("answer", re.sub(r"(<\|[a-z_]+\|>)+$", "", segment_text).strip())

    def format_observation(self, docs: list[Doc]) -> str:
        """main.py `search` and `curr_search_template` ('\\n\\n{output_text}<observation>{search_results}
        </observation>\\n\\n'): `(Title: t) text` lines, the last newline kept, right after the policy's text.
        The template's leading blank line and the strip of the policy's text (main.py rebuilds the prompt as
        text) change tokens the policy already wrote; ours keeps them as sampled."""
        body = "".join(f'(Title: "{d.title}") {d.text}\n' for d in docs)
        return f"<observation>{body}</observation>\n\n"

    def invalid_hint(self) -> str:
        return "<observation></observation>\n\n"

    @staticmethod
    def parse_evidence(response: str) -> str | None:
        """The last `<original_evidence>` block outside the observations, stripped; else None."""
        return parsing.last_block(parsing.policy_view(response, "observation"), "original_evidence")
