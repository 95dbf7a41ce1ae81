"""Output processing alone: the core's token ids in, text out (no model)."""

from titan.engine.beam_scoring import FinishedBeam
from titan.engine.core import CoreOutput
from titan.engine.output_processor import OutputProcessor
from titan.engine.outputs import FinishReason
from titan.engine.request import RequestStatus
from titan.engine.sampler import SampledToken
from titan.engine.sampling_params import SamplingParams

PROMPT = [1, 2, 3]


def step(token_id, status=RequestStatus.RUNNING, *, is_stop_token=False, stop_reason=None, n=1):
    return CoreOutput(
        "r",
        SampledToken(token_id, -0.5, ((token_id, -0.5),)),
        is_stop_token,
        status,
        stop_reason,
        num_prompt_tokens=len(PROMPT),
        num_output_tokens=n,
        num_cached_tokens=0,
    )


def run(processor, token_ids, last_status=RequestStatus.RUNNING, **last):
    outputs = [processor.process(step(t, n=i + 1)) for i, t in enumerate(token_ids[:-1])]
    n = len(token_ids)
    return [*outputs, processor.process(step(token_ids[-1], last_status, n=n, **last))]


def test_text_follows_the_tokens_and_a_stop_token_is_not_text(tokenizer):
    processor = OutputProcessor(tokenizer)
    processor.add_request("r", PROMPT, SamplingParams(logprobs=1, skip_special_tokens=False))
    ids = tokenizer.encode("Paris is lovely.")
    eos = tokenizer.eos_token_ids[0]
    outputs = run(processor, [*ids, eos], RequestStatus.FINISHED_STOPPED, is_stop_token=True)
    assert "".join(o.text for o in outputs) == "Paris is lovely."
    assert [o.token_ids[0] for o in outputs] == [*ids, eos]
    assert outputs[-1].is_finished and outputs[-1].finish_reason == FinishReason.STOP
    assert not any(o.is_finished for o in outputs[:-1])
    logprob = outputs[0].logprobs[0]
    assert logprob.token == tokenizer.token_text(ids[0]) and logprob.top[0].logprob == -0.5


def test_a_stop_string_finishes_a_request_the_core_still_runs(tokenizer):
    processor = OutputProcessor(tokenizer)
    processor.add_request("r", PROMPT, SamplingParams(stop=("lovely",)))
    outputs = []
    for n, token_id in enumerate(tokenizer.encode("Paris is lovely today"), start=1):
        outputs.append(processor.process(step(token_id, n=n)))
        if outputs[-1].is_finished:  # the engine then finishes it in the core
            break
    assert outputs[-1].finish_reason == FinishReason.STOP
    assert outputs[-1].stop_reason == "lovely"
    assert "".join(o.text for o in outputs) == "Paris is "
    assert len(outputs) < len(tokenizer.encode("Paris is lovely today"))


def test_an_abort_releases_the_held_back_text(tokenizer):
    processor = OutputProcessor(tokenizer)
    processor.add_request("r", PROMPT, SamplingParams(stop=("Paris is lovely",)))
    ids = tokenizer.encode("Paris is")
    texts = [processor.process(step(t)).text for t in ids]
    assert "".join(texts) == ""  # could still begin the stop string
    aborted = CoreOutput("r", None, False, RequestStatus.FINISHED_ABORTED, None, 3, 2, 0)
    output = processor.process(aborted)
    assert output.text == "Paris is" and output.token_ids == ()
    assert output.finish_reason == FinishReason.ABORT


def test_beam_search_sequences_are_decoded_when_it_finishes(tokenizer):
    processor = OutputProcessor(tokenizer)
    processor.add_beam_search("b", SamplingParams())
    best, other = tokenizer.encode("Paris."), tokenizer.encode("Lyon.")
    beams = (
        FinishedBeam(tuple(best), -1.0, -0.5, FinishReason.STOP),
        FinishedBeam(tuple(other), -2.0, -1.0, FinishReason.LENGTH),
    )
    done = CoreOutput("b", None, False, RequestStatus.FINISHED_STOPPED, None, 3, 4, 0, beams)
    output = processor.process(done)
    assert [b.text for b in output.beams] == ["Paris.", "Lyon."]
    assert output.text == "Paris." and output.finish_reason == FinishReason.STOP
