"""tfds: QA sources: tiny trivia_qa / natural_questions / generic builders prepared as array_record in a temp
data_dir (no TensorFlow, no download), read back through `load_examples("tfds:...")`; spec and layout errors."""

import sys

import numpy as np
import pytest
import tensorflow_datasets as tfds
from tensorflow_datasets.core.features import feature as feature_lib

from jaxsearch.data.qa import QADataError, QAExample, QAIterator, load_examples


# Not registered: the specs below find them from their prepared files, as they would the real datasets.
with tfds.core.registered.skip_registration():

    class TriviaQa(tfds.core.GeneratorBasedBuilder):
        """trivia_qa/rc.nocontext:1.1.0's question and answer features."""

        BUILDER_CONFIGS = [tfds.core.BuilderConfig(name="rc.nocontext", version="1.1.0")]

        def _info(self):
            answer = {
                "value": tfds.features.Text(),
                "aliases": tfds.features.Sequence(tfds.features.Text()),
                "normalized_aliases": tfds.features.Sequence(tfds.features.Text()),
            }
            features = {
                "question": tfds.features.Text(),
                "question_id": tfds.features.Text(),
                "answer": answer,
            }
            return tfds.core.DatasetInfo(
                builder=self, features=tfds.features.FeaturesDict(features), disable_shuffling=True
            )

        def _split_generators(self, dl_manager):
            return {
                "validation": self._generate_examples(TRIVIA_ROWS),
                "test": self._generate_examples(TRIVIA_TEST_ROWS),
            }

        def _generate_examples(self, rows):
            for row in rows:
                yield row["question_id"], row

    class NaturalQuestions(tfds.core.GeneratorBasedBuilder):
        """natural_questions/default:0.1.0's id, question and annotation features."""

        BUILDER_CONFIGS = [tfds.core.BuilderConfig(name="default", version="0.1.0")]

        def _info(self):
            short_answers = tfds.features.Sequence({"start_token": np.int64, "text": tfds.features.Text()})
            annotation = {
                "id": np.str_,
                "short_answers": short_answers,
                "yes_no_answer": tfds.features.ClassLabel(names=["NO", "YES"]),
            }
            features = {
                "id": np.str_,
                "question": {"text": tfds.features.Text(), "tokens": tfds.features.Sequence(np.str_)},
                "annotations": tfds.features.Sequence(annotation),
            }
            return tfds.core.DatasetInfo(
                builder=self, features=tfds.features.FeaturesDict(features), disable_shuffling=True
            )

        def _split_generators(self, dl_manager):
            return {"validation": self._generate_examples()}

        def _generate_examples(self):
            for row in NQ_ROWS:
                yield row["id"], row

    class TinyOpenQa(tfds.core.GeneratorBasedBuilder):
        """natural_questions_open's layout: `question` and a list of `answer`s, no id."""

        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            features = {"question": np.str_, "answer": tfds.features.Sequence(np.str_)}
            return tfds.core.DatasetInfo(
                builder=self, features=tfds.features.FeaturesDict(features), disable_shuffling=True
            )

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples()}

        def _generate_examples(self):
            yield 0, {"question": "who wrote hamlet", "answer": ["William Shakespeare", "Shakespeare"]}
            yield 1, {"question": "capital of peru", "answer": ["Lima"]}

    class TinyClassification(tfds.core.GeneratorBasedBuilder):
        """Not a QA layout."""

        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            features = {"text": tfds.features.Text(), "label": tfds.features.ClassLabel(names=["a", "b"])}
            return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(features))

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples()}

        def _generate_examples(self):
            yield 0, {"text": "x", "label": 1}


TRIVIA_ROWS = [
    {
        "question": "Which city is called the City of Light? ",
        "question_id": "tc_1",
        "answer": {"value": "Paris", "aliases": ["Paris", "City of Light"], "normalized_aliases": ["paris"]},
    },
    {
        "question": "Which element has the symbol Fe?",
        "question_id": "tc_2",
        "answer": {"value": "Iron", "aliases": [], "normalized_aliases": ["iron", ""]},
    },
]
TRIVIA_TEST_ROWS = [  # trivia_qa's test split hides the answers
    {
        "question": "Hidden?",
        "question_id": "tc_9",
        "answer": {"value": "", "aliases": [], "normalized_aliases": []},
    }
]
NQ_ROWS = [
    {
        "id": "101",
        "question": {"text": "who sang hey jude", "tokens": ["who", "sang", "hey", "jude"]},
        "annotations": [
            {
                "id": "a1",
                "short_answers": [
                    {"start_token": 3, "text": "The Beatles"},
                    {"start_token": 4, "text": "Beatles"},
                ],
                "yes_no_answer": -1,
            },
            {"id": "a2", "short_answers": [], "yes_no_answer": -1},
            {"id": "a3", "short_answers": [{"start_token": 3, "text": "The Beatles"}], "yes_no_answer": -1},
        ],
    },
    {  # long answer / yes-no only: skipped
        "id": "102",
        "question": {"text": "is the sky blue", "tokens": ["is", "the", "sky", "blue"]},
        "annotations": [{"id": "b1", "short_answers": [], "yes_no_answer": 1}],
    },
    {
        "id": "103",
        "question": {"text": "when was the eiffel tower built", "tokens": ["when"]},
        "annotations": [
            {"id": "c1", "short_answers": [{"start_token": 7, "text": "1889"}], "yes_no_answer": -1}
        ],
    },
]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """The four builders prepared as array_record (no download; TensorFlow not needed)."""
    data_dir = tmp_path_factory.mktemp("tfds")
    config = tfds.download.DownloadConfig(try_download_gcs=False)
    with pytest.MonkeyPatch.context() as mp:
        # tfds 4.9.10 serializes nested sequences (NQ's annotations/short_answers) with TensorInfo.dtype, which
        # is TensorFlow's dtype; the numpy one writes the same records without TensorFlow.
        mp.setattr(feature_lib.TensorInfo, "dtype", property(lambda self: self.np_dtype))
        for builder in (
            TriviaQa(config="rc.nocontext", data_dir=str(data_dir), file_format="array_record"),
            NaturalQuestions(config="default", data_dir=str(data_dir), file_format="array_record"),
            TinyOpenQa(data_dir=str(data_dir), file_format="array_record"),
            TinyClassification(data_dir=str(data_dir), file_format="array_record"),
        ):
            builder.download_and_prepare(download_config=config)
    return str(data_dir)


def test_trivia_qa(data_dir):
    examples = load_examples(f"tfds:trivia_qa/rc.nocontext:1.1.0?split=validation&data_dir={data_dir}")
    assert examples == [
        QAExample("tc_1", "Which city is called the City of Light?", ["Paris", "City of Light", "paris"]),
        QAExample("tc_2", "Which element has the symbol Fe?", ["Iron", "iron"]),
    ]
    # any tfds split expression; the options come in either order
    sliced = load_examples(f"tfds:trivia_qa/rc.nocontext:1.1.0?data_dir={data_dir}&split=validation[1:]")
    assert [ex.id for ex in sliced] == ["tc_2"]


def test_natural_questions_skips_unanswered(data_dir):
    examples = load_examples(f"tfds:natural_questions/default:0.1.0?split=validation&data_dir={data_dir}")
    assert examples == [
        QAExample("101", "who sang hey jude", ["The Beatles", "Beatles"]),
        QAExample("103", "when was the eiffel tower built", ["1889"]),
    ]


def test_generic_layout_and_iterator(data_dir):
    examples = load_examples(f"tfds:tiny_open_qa?split=train&data_dir={data_dir}")
    assert examples == [
        QAExample("tiny_open_qa_train_0", "who wrote hamlet", ["William Shakespeare", "Shakespeare"]),
        QAExample("tiny_open_qa_train_1", "capital of peru", ["Lima"]),
    ]
    batch = next(QAIterator(examples, batch_size=2, group_size=2, seed=0, shuffle=False))
    assert [ex.id for ex in batch] == ["tiny_open_qa_train_0"] * 2 + ["tiny_open_qa_train_1"] * 2


@pytest.mark.parametrize(
    "spec, message",
    [
        ("tfds:no_such_qa_builder?split=train", "no tfds builder 'no_such_qa_builder'"),
        (
            "tfds:tiny_classification?split=train",
            "tfds builder 'tiny_classification' has an unknown QA layout, fields ['label', 'text']",
        ),
        ("tfds:trivia_qa/rc.nocontext:1.1.0?split=test", "record 0: the question has no answers"),
        ("tfds:trivia_qa/rc.nocontext:1.1.0?split=train", "split 'train': Unknown split 'train'"),
        (
            "tfds:trivia_qa/rc.nocontext:9.9.9?split=validation",
            "cannot be loaded at version 9.9.9, only: 1.1.0",
        ),
        ("tfds:tiny_open_qa", "missing ?split=SPLIT"),
        ("tfds:tiny_open_qa?split=train&shuffle=1", "bad option 'shuffle=1'"),
        ("tfds:?split=train", "missing the builder name"),
    ],
)
def test_errors_name_the_culprit(data_dir, spec, message):
    spec = spec + (f"&data_dir={data_dir}" if "?" in spec else "")
    with pytest.raises(QADataError) as err:
        load_examples(spec)
    assert message in str(err.value) and str(err.value).startswith(spec)


def test_registered_builder_not_prepared(tmp_path):
    spec = f"tfds:trivia_qa/rc.nocontext?split=validation&data_dir={tmp_path}"
    with pytest.raises(
        QADataError, match="trivia_qa/rc.nocontext is not prepared in .*file_format=array_record"
    ):
        load_examples(spec)


def test_missing_tfds_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)
    with pytest.raises(ImportError, match=r'pip install -e "\.\[tfds\]"'):
        load_examples("tfds:trivia_qa?split=validation")


def test_launch_eval_keeps_tfds_specs():
    from jaxsearch.cli import eval as launch  # launch/eval.py's command
    tfds_spec = "tfds:trivia_qa/rc.nocontext:1.1.0?split=validation&data_dir=/data/tfds"
    assert launch._dataset(None, f"tqa={tfds_spec}") == ("tqa", tfds_spec)
