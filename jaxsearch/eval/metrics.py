"""Answer metrics, where DESIGN's public API lists them: they live in `jaxsearch.scoring.metrics` (what RL and
evaluation both use)."""

from jaxsearch.scoring.metrics import Regex, answer_in_text, exact_match, f1_score, normalize_answer, sub_exact_match

__all__ = ["Regex", "answer_in_text", "exact_match", "f1_score", "normalize_answer", "sub_exact_match"]
