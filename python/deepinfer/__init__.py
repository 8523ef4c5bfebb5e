"""deepinfer: offline batch inference for DeepSeek-V4.1-Flash.

    from deepinfer import LLM, SamplingParams
    llm = LLM()                      # $DEEPINFER_HF_MODEL_DIR, else the embedded default model
    outs = llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=32))
    print(outs[0].outputs[0].text)

Binds libdeepinfer.so through ctypes (see deepinfer._ffi for where it is
looked for)."""
from .llm import LLM, Tokenizer, env_describe
from .outputs import CompletionOutput, Logprob, RequestOutput
from .sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "Logprob", "Tokenizer", "env_describe",
           "version"]


def version():
    """The library's version string."""
    from . import _ffi
    return _ffi.lib().di_version().decode()
