"""QA examples from a prepared TensorFlow Datasets builder (optional extra: `pip install -e ".[tfds]"`).

Any QA path that starts with `tfds:` is a builder spec, so `qa.load_examples` (the trainer's `data.train` and
`data.eval`, `launch/eval.py --datasets`) reads it here:

    tfds:NAME[/CONFIG][:VERSION]?split=SPLIT[&data_dir=DIR]

e.g. `tfds:trivia_qa/rc.nocontext:1.1.0?split=validation&data_dir=/data/tfds`. NAME[/CONFIG][:VERSION] goes to
`tfds.builder` as written; SPLIT is any tfds split (`validation`, `train[:1000]`); DIR defaults to tfds's own
(`$TFDS_DATA_DIR`, else `~/tensorflow_datasets`). Nothing is downloaded: the split must already be prepared in
DIR as array_record or parquet, which `builder.as_data_source` reads without TensorFlow (preparing them, e.g.
`tfds build NAME/CONFIG --file_format=array_record`, does need TensorFlow); tfrecord files are refused.

Records -> `QAExample`, by the builder's feature layout (strings are decoded as UTF-8, answers are deduplicated
in order, empty ones dropped):

- trivia_qa (`question`, `question_id`, `answer/{value, aliases, normalized_aliases}`): answers = the value,
  then the aliases, then the normalized aliases. A record without any (the test split) is an error.
- natural_questions (`id`, `question/text`, `annotations/short_answers/text`): answers = the short answers of
  every annotation. Questions without a short answer (long answer or yes/no only) are skipped, as in NQ-open.
- any other builder with a text `question` and `answers` or `answer` (a text or a list of texts), e.g.
  natural_questions_open, web_questions: id = `id`, else `question_id`, else `{NAME}_{SPLIT}_{index}`.

Any other layout is a `QADataError` naming the builder and the fields it has. Examples come in the split's
stored order.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np

from jaxsearch.data.qa_example import QADataError, QAExample

TFDS_PREFIX = "tfds:"  # a QA path that is a tensorflow-datasets builder spec, not a file
OPTIONS = ("split", "data_dir")
TRIVIA_QA_FIELDS = ("question", "question_id", "answer/value", "answer/aliases", "answer/normalized_aliases")
NATURAL_QUESTIONS_FIELDS = ("id", "question/text", "annotations/short_answers/text")
READ_CHUNK = 1024  # records decoded per `__getitems__` call


def parse_spec(spec: str) -> tuple[str, str, str | None]:
    """`tfds:NAME?split=S[&data_dir=D]` -> (NAME, S, D or None)."""
    if not spec.startswith(TFDS_PREFIX):
        raise QADataError(f"{spec}: a tfds spec starts with {TFDS_PREFIX!r}")
    name, _, query = spec[len(TFDS_PREFIX) :].partition("?")
    if not name:
        raise QADataError(f"{spec}: missing the builder name (tfds:NAME[/CONFIG][:VERSION]?split=SPLIT)")
    options = {}
    for item in query.split("&") if query else []:
        key, sep, value = item.partition("=")
        if key not in OPTIONS or not sep or not value:
            raise QADataError(f"{spec}: bad option {item!r} (expected split=SPLIT or data_dir=DIR)")
        options[key] = value
    if "split" not in options:
        raise QADataError(f"{spec}: missing ?split=SPLIT (e.g. {TFDS_PREFIX}{name}?split=validation)")
    data_dir = options.get("data_dir")
    if data_dir is not None:
        data_dir = os.path.abspath(os.path.expanduser(data_dir))
    return name, options["split"], data_dir


def import_tfds(spec: str):
    """The tensorflow_datasets module, or an ImportError that says how to install it."""
    try:
        import tensorflow_datasets
    except ImportError:
        raise ImportError(
            f'{spec}: reading tfds datasets needs tensorflow-datasets and array_record: pip install -e ".[tfds]"'
        ) from None
    return tensorflow_datasets


def iter_examples(spec: str) -> Iterator[QAExample]:
    """Streams the examples of one tfds split; errors name the spec (and the record index)."""
    name, split, data_dir = parse_spec(spec)
    tfds = import_tfds(spec)
    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError:
        where = data_dir or "the default tfds data_dir ($TFDS_DATA_DIR or ~/tensorflow_datasets)"
        raise QADataError(
            f"{spec}: no tfds builder {name!r}: neither registered in tensorflow-datasets "
            f"{tfds.__version__} nor prepared in {where}"
        ) from None
    except (ValueError, AssertionError) as e:  # an unknown config (ValueError) or version (AssertionError)
        raise QADataError(f"{spec}: {str(e).splitlines()[0].strip()}") from None
    if not builder.is_prepared():
        raise QADataError(
            f"{spec}: {name} is not prepared in {builder.data_dir}; prepare it first "
            f"(tfds build {name} --data_dir DIR --file_format=array_record), nothing is downloaded here"
        )
    read = _mapping(spec, builder.name, _field_names(builder.info.features.get_tensor_info()))
    try:
        source = builder.as_data_source(split=split)
    except NotImplementedError:
        raise QADataError(
            f"{spec}: {name} is stored as {builder.info.file_format.value}, which needs TensorFlow to read; "
            f"prepare it with --file_format=array_record (or parquet)"
        ) from None
    except (ValueError, KeyError) as e:  # an unknown split or a bad slice
        raise QADataError(f"{spec}: split {split!r}: {e}") from None
    count = 0
    for start in range(0, len(source), READ_CHUNK):
        indices = list(range(start, min(start + READ_CHUNK, len(source))))
        for index, record in zip(indices, source.__getitems__(indices)):
            example = read(record, f"{spec}: record {index}", f"{builder.name}_{split}_{index}")
            if example is not None:
                count += 1
                yield example
    if count == 0:
        raise QADataError(f"{spec}: the split has no examples")


def _field_names(tree: dict, prefix: str = "") -> list[str]:
    """Nested feature dict -> sorted leaf paths ("answer/aliases")."""
    names = []
    for key, value in tree.items():
        path = f"{prefix}{key}"
        names.extend(_field_names(value, path + "/") if isinstance(value, dict) else [path])
    return sorted(names)


def _mapping(spec: str, builder_name: str, fields: list[str]):
    """The record -> QAExample function for this feature layout."""
    if all(f in fields for f in TRIVIA_QA_FIELDS):
        return _trivia_qa
    if all(f in fields for f in NATURAL_QUESTIONS_FIELDS):
        return _natural_questions
    answer_field = next((f for f in ("answers", "answer") if f in fields), None)
    if "question" in fields and answer_field is not None:
        return lambda record, where, fallback_id: _generic(record, where, fallback_id, answer_field)
    raise QADataError(
        f"{spec}: tfds builder {builder_name!r} has an unknown QA layout, fields {fields}; expected trivia_qa's "
        f"{list(TRIVIA_QA_FIELDS)}, natural_questions' {list(NATURAL_QUESTIONS_FIELDS)}, or 'question' "
        f"with 'answers' or 'answer'"
    )


def _trivia_qa(record: dict, where: str, fallback_id: str) -> QAExample:
    answer = record["answer"]
    answers = [answer["value"], *answer["aliases"], *answer["normalized_aliases"]]
    return _example(record["question_id"], record["question"], answers, where, skip_unanswered=False)


def _natural_questions(record: dict, where: str, fallback_id: str) -> QAExample | None:
    answers = [text for texts in record["annotations"]["short_answers"]["text"] for text in texts]
    return _example(record["id"], record["question"]["text"], answers, where, skip_unanswered=True)


def _generic(record: dict, where: str, fallback_id: str, answer_field: str) -> QAExample:
    value = record[answer_field]
    answers = [value] if isinstance(value, (bytes, str)) else list(value)
    example_id = record.get("id", record.get("question_id", fallback_id))
    return _example(example_id, record["question"], answers, where, skip_unanswered=False)


def _example(
    example_id: object, question: object, answers: list, where: str, skip_unanswered: bool
) -> QAExample | None:
    """Decoded fields -> QAExample; None for an unanswered question when `skip_unanswered`."""
    question = _text(question, "question", where).strip()
    if not question:
        raise QADataError(f"{where}: field 'question' is empty")
    golden = []
    for answer in answers:
        answer = _text(answer, "answer", where).strip()
        if answer and answer not in golden:
            golden.append(answer)
    if not golden:
        if skip_unanswered:
            return None
        raise QADataError(f"{where}: the question has no answers")
    if isinstance(example_id, (int, np.integer)):
        example_id = str(example_id)
    return QAExample(id=_text(example_id, "id", where), question=question, golden_answers=golden)


def _text(value: object, field: str, where: str) -> str:
    """A decoded tfds string (bytes) -> str."""
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise QADataError(f"{where}: field '{field}' is not valid UTF-8: {value[:40]!r}") from None
    if isinstance(value, str):
        return str(value)
    raise QADataError(f"{where}: field '{field}' must be a string, got {type(value).__name__}: {value!r}")
