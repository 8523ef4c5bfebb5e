"""RequestOutput / CompletionOutput / Logprob with vLLM's field names
(ecosystem.md §4.1). Chat requests also carry the parsed assistant message
(`reasoning_content`, `content`, `tool_calls`) on each completion."""


class Logprob:
    __slots__ = ("logprob", "rank", "decoded_token")

    def __init__(self, logprob, rank=None, decoded_token=None):
        self.logprob = logprob
        self.rank = rank
        self.decoded_token = decoded_token

    def __repr__(self):
        return "Logprob(logprob=%r, rank=%r, decoded_token=%r)" % (self.logprob, self.rank, self.decoded_token)

    def __eq__(self, other):
        return isinstance(other, Logprob) and (self.logprob, self.rank, self.decoded_token) == (
            other.logprob, other.rank, other.decoded_token)


class CompletionOutput:
    """One completion. finish_reason: "stop", "length", "constraint" (the
    constraint allowed no token) or "abort"; stop_reason: the matched stop
    string or stop token id, None for EOS or a length finish."""

    def __init__(self, index, text, token_ids, cumulative_logprob=None, logprobs=None, finish_reason=None,
                 stop_reason=None, reasoning_content=None, content=None, tool_calls=None):
        self.index = index
        self.text = text
        self.token_ids = token_ids
        self.cumulative_logprob = cumulative_logprob
        self.logprobs = logprobs
        self.finish_reason = finish_reason
        self.stop_reason = stop_reason
        self.reasoning_content = reasoning_content
        self.content = content
        self.tool_calls = tool_calls

    def finished(self):
        return self.finish_reason is not None

    def __repr__(self):
        return ("CompletionOutput(index=%r, text=%r, token_ids=%r, cumulative_logprob=%r, finish_reason=%r, "
                "stop_reason=%r)" % (self.index, self.text, self.token_ids, self.cumulative_logprob,
                                     self.finish_reason, self.stop_reason))


class RequestOutput:
    def __init__(self, request_id, prompt, prompt_token_ids, prompt_logprobs, outputs, finished=True,
                 metrics=None, num_cached_tokens=0):
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        self.prompt_logprobs = prompt_logprobs
        self.outputs = outputs
        self.finished = finished
        self.metrics = metrics
        self.num_cached_tokens = num_cached_tokens

    def __repr__(self):
        return ("RequestOutput(request_id=%r, prompt=%r, prompt_token_ids=%r, outputs=%r, finished=%r)" %
                (self.request_id, self.prompt, self.prompt_token_ids, self.outputs, self.finished))
