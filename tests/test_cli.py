"""The `focus` command, run in-process: train, eval and generate on a tiny model and the data mirror."""

import json

import pytest

from focus.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


def test_help_lists_the_commands_and_each_option_says_what_it_sets(capsys):
    assert main([]) == 2 and "focus train" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps the help lines
    for expected in ("Groups (centroids) per routing head.", "Peak AdamW learning rate", "--route_queries {key,query,kv_head}",
                     "Folder for adapter/, metrics.jsonl"):
        assert expected in text, expected


def test_version_is_the_package_version(capsys):
    from focus import __version__

    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"focus {__version__}\n"


def test_unknown_commands_and_missing_adapters_are_one_line_errors(tmp_path, capsys):
    assert main(["tune"]) == 2
    assert capsys.readouterr().err.strip() == "focus: error: unknown command 'tune'; one of train, eval, generate, bench"
    assert main(["generate", "--model", "tiny:llama", "--adapter", str(tmp_path / "absent"), "--prompt", "Hi"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("focus generate: error: no Focus adapter at ") and "\n" not in error


CARELESS = {  # argv -> the one line it ends in, before a model or tokenizer loads (or converts, on a new machine)
    "window covers the row": (["train", "--model", "tiny:llama", "--output", "{tmp}/run", "--seq_len", "64"],
                              "--window 256 covers every --seq_len 64 tokens of a row"),
    "row beyond the positions": (["train", "--model", "tiny:gpt2", "--output", "{tmp}/run", "--seq_len", "4096",
                                  "--window", "8"], "--seq_len 4096 is beyond the 2048 positions tiny:gpt2"),
    "no such model folder": (["train", "--model", "{tmp}/absent", "--output", "{tmp}/run"],
                             "--model: unknown model '{tmp}/absent': not 'smollm2-135m-instruct', tiny:<family>"),
    "output under a file": (["train", "--model", "tiny:llama", "--output", "{tmp}/file/run", "--seq_len", "64",
                             "--window", "8"], "Not a directory: '{tmp}/file/run'"),
    "no such corpus": (["train", "--model", "tiny:llama", "--output", "{tmp}/run", "--domain", "novels",
                        "--seq_len", "64", "--window", "8"], "unknown corpus 'novels'"),
    "a broad corpus without its share": (["train", "--model", "tiny:llama", "--output", "{tmp}/run", "--seq_len", "64",
                                          "--window", "8", "--broad", "nonfiction"],
                                         "--broad and --broad_share go together"),
    "shares that leave no domain rows": (["train", "--model", "tiny:llama", "--output", "{tmp}/run", "--seq_len", "64",
                                          "--window", "8", "--broad", "nonfiction", "--broad_share", "0.8"],
                                         "retrieval_share 0.25 + broad_share 0.8 leave no room for the domain's rows"),
    "a task only the hub holds, offline": (["eval", "--model", "tiny:llama", "--tasks", "mmlu"],
                                           "--tasks mmlu: not in the data mirror and the hub is"),
    "empty prompt": (["generate", "--model", "tiny:llama", "--prompt", ""], "--prompt is empty"),
    "a device this torch lacks": (["generate", "--model", "tiny:llama", "--prompt", "Hi", "--device", "cuda"],
                                  "--device cuda: this torch sees no CUDA device"),
    "not a device": (["generate", "--model", "tiny:llama", "--prompt", "Hi", "--device", "gpu0"],
                     "--device 'gpu0': "),
    "generation beyond the positions": (["generate", "--model", "tiny:llama", "--prompt", "Hi", "--max_new_tokens",
                                         "5000"], "a prompt token + --max_new_tokens = 5001 is beyond the 2048"),
    "negative length": (["bench", "--kind", "decode", "--lengths", "-5", "--model", ""],
                        "--lengths must be positive token counts, got -5"),
    "eval context beyond the positions": (["eval", "--model", "tiny:qwen2", "--context_length", "9000"],
                                          "--context_length 9000 is beyond the 2048 positions"),
    "a folder that holds no adapter": (["eval", "--model", "tiny:qwen2", "--adapter", "{tmp}"],
                                       "no Focus adapter at {tmp}: focus_config.json not found"),
}


@pytest.mark.parametrize("case", sorted(CARELESS))
def test_careless_inputs_are_one_line_errors_leaving_nothing_behind(case, tmp_path, capsys):
    argv, expected = CARELESS[case]
    (tmp_path / "file").write_text("a file, not a folder")
    assert main([arg.replace("{tmp}", str(tmp_path)) for arg in argv]) == 2
    error = capsys.readouterr().err
    command = argv[0]
    assert error.count("\n") == 1 and error.startswith(f"focus {command}: error: "), error  # no progress bar before
    assert expected.replace("{tmp}", str(tmp_path)) in error
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # no output folder begun


def test_train_then_eval_then_generate_through_the_adapter(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--model", "tiny:llama", "--output", str(out), "--seq_len", "64", "--calibration_rows", "2",
                 "--eval_rows", "2", "--steps", "2", "--batch_size", "2", "--lr", "1e-2", "--num_groups", "4",
                 "--window", "8", "--top_k", "1", "--checkpoint_every", "0"]) == 0
    assert "validation perplexity" in capsys.readouterr().out
    assert json.loads((out / "summary.json").read_text())["final"]["step"] == 2
    assert (out / "adapter" / "README.md").is_file()

    record = tmp_path / "eval.json"
    assert main(["eval", "--model", "tiny:llama", "--adapter", str(out / "adapter"), "--mode", "hard", "--split",
                 "validation", "--context_length", "64", "--max_tokens", "256", "--output", str(record)]) == 0
    assert capsys.readouterr().out.startswith("books validation perplexity ")
    saved = json.loads(record.read_text())
    assert saved["method"] == "focus-hard" and saved["tokens"] == 255  # every token after the first is scored

    generate = ["generate", "--model", "tiny:llama", "--adapter", str(out / "adapter"), "--prompt", "Once upon a time",
                "--max_new_tokens", "12"]
    assert main([*generate, "--kernels", "eager"]) == 0
    continuation = capsys.readouterr().out
    assert continuation.strip()  # the continuation (random weights: any text)
    assert main(generate) == 0  # the native kernels, the default on the CPU: the same greedy tokens
    assert capsys.readouterr().out == continuation


def test_a_finished_run_is_not_replaced_without_overwrite_and_a_damaged_token_file_is_rebuilt(tmp_path, capsys):
    out = tmp_path / "run"
    train = ["train", "--model", "tiny:llama", "--output", str(out), "--seq_len", "64", "--calibration_rows", "2",
             "--eval_rows", "2", "--steps", "2", "--batch_size", "2", "--num_groups", "4", "--window", "8",
             "--checkpoint_every", "0", "--retrieval_share", "0"]  # window 16 leaves rows of 64 no room for a fact
    assert main(train) == 0
    adapter = (out / "adapter" / "focus_centroids.safetensors").read_bytes()
    capsys.readouterr()
    assert main([*train, "--window", "16"]) == 2
    assert capsys.readouterr().err.strip() == (f"focus train: error: {out} holds a finished run (summary.json, "
                                               "adapter/); choose another --output, or --overwrite to train anew "
                                               "and replace it")
    assert (out / "adapter" / "focus_centroids.safetensors").read_bytes() == adapter

    tokens = out / "books.tokens.safetensors"
    tokens.write_bytes(tokens.read_bytes()[:100])  # cut short, as by a crash while it was copied
    assert main([*train, "--window", "16", "--overwrite"]) == 0
    assert f"focus train: {tokens} is unreadable" in capsys.readouterr().err
    assert json.loads((out / "summary.json").read_text())["focus_config"]["window"] == 16


def test_bench_writes_the_decode_tables_and_refuses_malformed_settings(tmp_path, capsys):
    assert main(["bench", "--kind", "decode", "--lengths", "1024", "--settings", "8:64:1", "--model", "",
                 "--repeats", "1", "--output", str(tmp_path), "--tag", "t", "--kernels", "native"]) == 0
    assert "| cache |" in capsys.readouterr().out.replace("|   cache |", "| cache |")
    assert (tmp_path / "decode_step_t.csv").is_file() and (tmp_path / "decode_speedup_t.png").is_file()
    assert "native_s" in (tmp_path / "decode_step_t.csv").read_text().splitlines()[0]
    assert main(["bench", "--kind", "decode", "--settings", "8:64", "--output", str(tmp_path / "bad")]) == 2
    assert "groups:window:top_k" in capsys.readouterr().err and not (tmp_path / "bad").exists()


def test_settings_are_parsed_as_colon_separated_integers():
    from focus.eval.speed import parse_settings

    assert parse_settings(["16:256:1", "8:64:2"]) == [[16, 256, 1], [8, 64, 2]]
    assert parse_settings(["9:3"], "query heads:key/value heads") == [[9, 3]]
    for bad in ("16:256", "16:256:x", "16:256:1:2"):
        with pytest.raises(ValueError, match="groups:window:top_k"):
            parse_settings([bad])


def test_short_rows_train_without_the_default_retrieval_rows_with_one_warning_line(tmp_path):
    """As a user runs it (a process of its own: pytest would catch the warning): one line, and an asked share of
    retrieval rows the rows cannot hold still refuses."""
    import subprocess
    import sys

    train = [sys.executable, "-m", "focus.cli", "train", "--model", "tiny:llama", "--seq_len", "64", "--window", "32",
             "--calibration_rows", "2", "--eval_rows", "2", "--steps", "1", "--batch_size", "2", "--num_groups", "4",
             "--checkpoint_every", "0"]
    done = subprocess.run([*train, "--output", str(tmp_path / "run")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    warned = [line for line in done.stderr.splitlines() if "warning" in line]
    assert warned == ["focus train: warning: training without retrieval rows: rows of 64 tokens have no room for a "
                      "fact 32 tokens before its question (set retrieval_share to ask for them)"]
    asked = subprocess.run([*train, "--output", str(tmp_path / "asked"), "--retrieval_share", "0.25"],
                           capture_output=True, text=True)
    assert asked.returncode == 2 and "no room for a fact 32 tokens" in asked.stderr.splitlines()[-1]
