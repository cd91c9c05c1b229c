"""Reading ComfyUI's answers and messages (shapes from ComfyUI's server.py/execution.py)."""

from __future__ import annotations

import json

from apirunner.comfy_protocol import (
    describe_rejection,
    failing_outputs,
    output_files,
    queue_spot,
    read_message,
    read_outcome,
)


def test_a_rejection_names_the_node_and_the_input() -> None:
    body = {
        "error": {
            "type": "prompt_outputs_failed_validation",
            "message": "Prompt outputs failed validation",
            "details": "",
        },
        "node_errors": {
            "3": {
                "errors": [
                    {
                        "type": "value_not_in_list",
                        "message": "Value not in list",
                        "details": "sampler_name: 'eulr' not in ['euler']",
                        "extra_info": {"input_name": "sampler_name"},
                    }
                ],
                "dependent_outputs": ["9"],
                "class_type": "KSampler",
            }
        },
    }
    text = describe_rejection(json.dumps(body))
    assert text == (
        "ComfyUI refused the workflow: Prompt outputs failed validation; node 3 (KSampler) "
        "input sampler_name: Value not in list [sampler_name: 'eulr' not in ['euler']]"
    )
    assert failing_outputs(body["node_errors"]) == {"9"}


def test_an_unknown_node_type_says_which_node() -> None:
    body = {
        "error": {
            "type": "missing_node_type",
            "message": "Node 'Upscaler' not found.",
            "details": "Node ID '#12'",
        },
        "node_errors": {},
    }
    assert describe_rejection(json.dumps(body)) == (
        "ComfyUI refused the workflow: Node 'Upscaler' not found. (Node ID '#12')"
    )
    assert describe_rejection("<html>bad gateway</html>").endswith("<html>bad gateway</html>")


def test_the_queue_position_follows_the_numbers_not_the_heap_order() -> None:
    answer = {
        "queue_running": [[4, "run", {}, {}, []]],
        "queue_pending": [[5, "a", {}, {}, []], [9, "ours", {}, {}, []], [7, "b", {}, {}, []]],
    }
    assert (queue_spot(answer, "ours").place, queue_spot(answer, "ours").ahead) == ("pending", 3)
    assert queue_spot(answer, "run").place == "running"
    assert queue_spot(answer, "gone").place == "absent"
    assert queue_spot({"queue_pending": "junk"}, "ours").place == "absent"


def test_history_endings() -> None:
    ok = {"status": {"status_str": "success", "completed": True, "messages": []}}
    assert read_outcome(ok).ending == "success"
    error = {
        "status": {
            "status_str": "error",
            "completed": False,
            "messages": [
                ["execution_start", {}],
                [
                    "execution_error",
                    {
                        "node_id": "3",
                        "node_type": "KSampler",
                        "exception_type": "torch.OutOfMemoryError",
                        "exception_message": "CUDA out of memory",
                    },
                ],
            ],
        }
    }
    failed = read_outcome(error)
    assert failed.ending == "failed" and failed.failure is not None
    assert failed.failure.retryable  # out of memory depends on the GPU, not the graph
    assert "node 3 (KSampler)" in failed.failure.message
    stopped = {"status": {"status_str": "error", "messages": [["execution_interrupted", {}]]}}
    assert read_outcome(stopped).ending == "interrupted"


def test_output_files_of_the_chosen_nodes_only() -> None:
    entry = {
        "outputs": {
            "9": {"images": [{"filename": "a_00001_.png", "subfolder": "shots", "type": "output"}]},
            "12": {
                "images": [{"filename": "p.png", "subfolder": "", "type": "temp"}],
                "text": ["x"],
            },
            "13": {"gifs": [{"filename": "v.mp4"}, "junk", {"filename": 3}]},
        }
    }
    assert [f.filename for f in output_files(entry, None)] == ["a_00001_.png", "p.png", "v.mp4"]
    (only,) = output_files(entry, ("9",))
    assert (only.subfolder, only.type) == ("shots", "output")
    assert output_files({"outputs": []}, None) == []


def test_only_our_prompts_messages_count() -> None:
    def msg(kind: str, **data: object) -> str:
        return json.dumps({"type": kind, "data": data})

    progress = read_message(msg("progress", value=5, max=20, prompt_id="p"), "p")
    assert progress is not None and progress.progress == 25.0
    assert read_message(msg("progress", value=5, max=20, prompt_id="other"), "p") is None
    assert read_message(msg("progress", value=5, max=0, prompt_id="p"), "p") is None
    ended = read_message(msg("executing", node=None, prompt_id="p"), "p")
    assert ended is not None and ended.kind == "ended"
    # A reconnect's replay has no prompt_id: it is not an ending.
    assert read_message(msg("executing", node=None), "p") is None
    assert read_message(msg("progress_state", prompt_id="p", nodes={}), "p") is None
    assert read_message(b"\x00\x01binary preview", "p") is None
    assert read_message("not json", "p") is None


def _node_error(kind: str, message: str) -> dict[str, object]:
    return {
        "status": {
            "status_str": "error",
            "messages": [
                [
                    "execution_error",
                    {
                        "node_id": "4",
                        "node_type": "ImageScale",
                        "exception_type": kind,
                        "exception_message": message,
                    },
                ]
            ],
        }
    }


def test_a_word_containing_oom_is_not_out_of_memory() -> None:
    for message in ("zoom factor must be positive", "no room left in the batch", "boom\n"):
        failure = read_outcome(_node_error("ValueError", message)).failure
        assert failure is not None and not failure.retryable, message


def test_out_of_memory_is_read_from_the_exception_type_or_the_phrase() -> None:
    for kind, message in (
        ("torch.OutOfMemoryError", "Allocation on device"),
        ("torch.cuda.OutOfMemoryError", "tried to allocate 2.00 GiB"),
        ("RuntimeError", "CUDA out of memory. Tried to allocate 20.00 MiB"),
    ):
        failure = read_outcome(_node_error(kind, message)).failure
        assert failure is not None and failure.retryable, (kind, message)


def test_a_node_error_message_loses_comfyuis_trailing_newline() -> None:
    failure = read_outcome(_node_error("ValueError", "bad size\n")).failure
    assert failure is not None and failure.message.endswith("ValueError: bad size")
