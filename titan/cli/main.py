"""``titan``: the command line (typer). Sync at this edge; everything below it is async."""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated

import typer

from titan.cli.bench_url import bench_url
from titan.cli.cache import cache_app
from titan.cli.chaos import chaos
from titan.cli.config import config_app
from titan.cli.jobs import jobs_app
from titan.cli.keys import keys_app
from titan.cli.plan import plan
from titan.cli.simulate import simulate
from titan.cli.storage import storage_app
from titan.cli.worker import worker
from titan.config import TitanConfig
from titan.config.overrides import Override
from titan.config.resolution import (
    UPSTREAM_API_KEY_ENV,
    Resolved,
    resolve_settings,
    upstream_flag,
)
from titan.config.summary import shown_url
from titan.errors import ConfigError, TitanError

# Long uvicorn shutdowns hold a deploy back; streams still open after this are cut.
GRACEFUL_SHUTDOWN_S = 10


# The embedded engine's settings that serve flags may set: field -> flag.
_ENGINE_FLAGS = {
    "model": "--model",
    "served_model_name": "--served-model-name",
    "device": "--device",
    "dtype": "--dtype",
    "quantization": "--quantization",
    "attention_precision": "--attention-precision",
    "max_num_seqs": "--max-num-seqs",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "kv_cache_bytes": "--kv-cache-memory",
    "num_kv_blocks": "--num-kv-blocks",
    "max_model_len": "--max-model-len",
    "num_threads": "--num-threads",
}


def serve_settings(
    *,
    config_file: Path | None = None,
    upstream: str | None = None,
    api_key: str | None = None,
    host: str | None = None,
    port: int | None = None,
    log_level: str | None = None,
    model: str | None = None,
    served_model_name: str | None = None,
    device: str | None = None,
    dtype: str | None = None,
    quantization: str | None = None,
    attention_precision: str | None = None,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    kv_cache_memory: str | None = None,
    num_kv_blocks: int | None = None,
    max_model_len: int | None = None,
    num_threads: int | None = None,
    storage: str | None = None,
    allow_unauthenticated: bool = False,
    environ: Mapping[str, str] | None = None,
) -> Resolved:
    """The settings the serve flags describe (``resolve_settings``: the defaults, the file,
    ``TITAN_*`` variables, the flags). Raises ConfigError naming the bad flag or key.

    Engine flags set the one embedded deployment; with ``--upstream``, ``--model`` is the
    upstream's model name and the config holds that upstream only.
    """
    engine_values = {
        "model": None if upstream is not None else model,
        "served_model_name": served_model_name,
        "device": device,
        "dtype": dtype,
        "quantization": quantization,
        "attention_precision": attention_precision,
        "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": max_num_batched_tokens,
        "kv_cache_bytes": kv_cache_memory,
        "num_kv_blocks": num_kv_blocks,
        "max_model_len": max_model_len,
        "num_threads": num_threads,
    }
    engine_values = {key: value for key, value in engine_values.items() if value is not None}
    engine_flags = ", ".join(_ENGINE_FLAGS[key] for key in engine_values)
    if config_file is not None and upstream is not None:
        raise ConfigError(
            "--config and --upstream cannot be combined: "
            "list the upstream as an openai deployment in the file"
        )
    if api_key is not None and upstream is None:
        raise ConfigError("--api-key is the key of an --upstream; it needs --upstream")
    if upstream is not None and engine_values:
        raise ConfigError(f"{engine_flags} set the embedded engine; not with --upstream")

    server_values = {"host": host, "port": port, "log_level": log_level and log_level.lower()}
    flags = [
        Override(("server", key), value, f"--{key.replace('_', '-')}")
        for key, value in server_values.items()
        if value is not None
    ]
    if storage is not None:
        flags.append(Override(("storage",), storage, "--storage"))
    if allow_unauthenticated:
        flags.append(Override(("auth", "allow_unauthenticated"), True, "--allow-unauthenticated"))
    if upstream is not None:
        flags.append(upstream_flag(upstream, model, api_key, environ))
    resolved = resolve_settings(config_file=config_file, flags=flags, environ=environ)
    if not engine_values:
        return resolved
    # Engine flags set the embedded deployment wherever the file (or the defaults) put it.
    where = _the_embedded_deployment(resolved.config, engine_flags, file=config_file)
    flags += [
        Override((*where, "engine", key), value, _ENGINE_FLAGS[key])
        for key, value in engine_values.items()
    ]
    return resolve_settings(config_file=config_file, flags=flags, environ=environ)


def _the_embedded_deployment(
    config: TitanConfig, engine_flags: str, *, file: Path | None
) -> tuple[str | int, ...]:
    """The key path of the config's only embedded deployment, which engine flags set."""
    paths = [
        ("models", i, "deployments", j)
        for i, model in enumerate(config.models)
        for j, deployment in enumerate(model.deployments)
        if deployment.backend == "embedded"
    ]
    if len(paths) != 1:
        raise ConfigError(
            f"{engine_flags} set the embedded engine, which needs exactly one embedded "
            f"deployment in {file}; it has {len(paths)}: set these in the file instead"
        )
    return paths[0]


def run_server(settings: Resolved) -> int:
    """Serve until interrupted; returns the process exit code (1 if the models failed to load)."""
    # Imported here so that `titan --help` stays quick.
    import uvicorn

    from titan.api import create_app
    from titan.api.header_deadline import uvicorn_http_protocol
    from titan.observability import configure_logging

    config = settings.config
    configure_logging(config.server.log_level)
    # What a user asked for and where it was read, before anything else can go wrong; the
    # storage always, since keys there decide whether auth is on.
    rows = settings.explained()
    if not any(key == "storage" for key, _, _ in rows):
        rows.append(("storage", shown_url(config.storage), settings.origin("storage")))
    logging.getLogger("titan.settings").info(
        "settings: %s",
        "; ".join(f"{key}={value} ({origin})" for key, value, origin in rows),
        extra={"settings": {key: origin for key, _, origin in rows}},
    )
    exit_code = 0
    server: uvicorn.Server | None = None

    def stop_on_start_failure(exc: BaseException) -> None:
        nonlocal exit_code
        exit_code = 1
        if server is not None:
            server.should_exit = True

    app = create_app(config, on_start_failure=stop_on_start_failure)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=config.server.host,
            port=config.server.port,
            loop="uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
            http=uvicorn_http_protocol(
                "httptools" if importlib.util.find_spec("httptools") else "h11",
                config.server.limits.header_timeout_s,
            ),
            workers=1,
            lifespan="on",
            # Titan's own request line (titan.requests) says more than uvicorn's access line.
            access_log=not config.observability.log_requests,
            log_config=None,  # configure_logging already set up JSON logs for uvicorn too
            log_level=config.server.log_level,
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        )
    )
    server.run()
    return exit_code


def serve(
    config_file: Annotated[
        Path | None,
        typer.Option(
            "--config",
            help="A titan.yaml (or .json) config file; see `titan config check`. Without one: "
            "the embedded model, or --upstream.",
        ),
    ] = None,
    upstream: Annotated[
        str | None,
        typer.Option(
            help="Serve an OpenAI-compatible server through Titan instead of the embedded "
            "model, e.g. http://host:8000/v1 (vLLM, SGLang, TGI, Ollama, llama.cpp, OpenAI): "
            "every model it lists, or only --model.",
        ),
    ] = None,
    api_key: Annotated[
        str | None,
        typer.Option(
            help=f"The --upstream's API key (default: ${UPSTREAM_API_KEY_ENV}, which, unlike "
            "a flag, other users cannot see in the process list).",
        ),
    ] = None,
    host: Annotated[
        str | None, typer.Option(help="Address to listen on (default: 127.0.0.1).")
    ] = None,
    port: Annotated[int | None, typer.Option(help="Port to listen on (default: 8000).")] = None,
    model: Annotated[
        str | None,
        typer.Option(
            help="Without --upstream: the embedded model, a .gguf file or an HF model directory "
            "(default: SmolLM2-135M-Instruct). With --upstream: the upstream's model to serve "
            "(default: every model it lists)."
        ),
    ] = None,
    served_model_name: Annotated[
        str | None, typer.Option(help="The model id clients use (default: from the model).")
    ] = None,
    device: Annotated[str | None, typer.Option(help="auto, cpu, cuda or cuda:N.")] = None,
    dtype: Annotated[
        str | None,
        typer.Option(help="auto, float32, bfloat16 or float16: dense weights in that dtype."),
    ] = None,
    quantization: Annotated[
        str | None,
        typer.Option(
            help="auto (a GGUF file's own Q4_1/Q8_0 blocks on the CPU kernels, unless --dtype "
            "is set), none (dense weights in torch) or q8_0 (every matmul quantized to Q8_0)."
        ),
    ] = None,
    attention_precision: Annotated[
        str | None,
        typer.Option(
            help="auto (the quantized path's attention in reduced precision where the CPU has "
            "a unit for it: bfloat16 tiles with AMX, int8 scores and values with AVX-512 VNNI "
            "and BF16 or with AVX2; float32 elsewhere) or float32 (float32 everywhere)."
        ),
    ] = None,
    max_num_seqs: Annotated[
        int | None, typer.Option(help="Most sequences in one engine step.")
    ] = None,
    max_num_batched_tokens: Annotated[
        int | None, typer.Option(help="Token budget of one engine step.")
    ] = None,
    kv_cache_memory: Annotated[
        str | None, typer.Option(help="KV cache size, e.g. 2GiB or 512MiB.")
    ] = None,
    num_kv_blocks: Annotated[
        int | None, typer.Option(help="KV cache size in blocks (overrides --kv-cache-memory).")
    ] = None,
    max_model_len: Annotated[
        int | None, typer.Option(help="Cap on the context window, in tokens.")
    ] = None,
    num_threads: Annotated[
        int | None,
        typer.Option(
            help="Threads of the engine's CPU kernels (default: every core for quantized "
            "weights, cores - 1 for torch's)."
        ),
    ] = None,
    log_level: Annotated[
        str | None,
        typer.Option(help="debug, info, warning, error or critical (default: info)."),
    ] = None,
    storage: Annotated[
        str | None,
        typer.Option(
            help="Where keys, usage and limits live: memory://, sqlite:///PATH (default: "
            "sqlite:///~/.local/share/titan/titan.db) or redis://HOST:PORT/DB (replicas)."
        ),
    ] = None,
    allow_unauthenticated: Annotated[
        bool,
        typer.Option(
            "--allow-unauthenticated",
            help="Serve a non-loopback --host without API keys (refused otherwise).",
        ),
    ] = False,
) -> None:
    """Serve the OpenAI-compatible API: the embedded model, an --upstream, or a --config file.

    Later wins: the config file (or the defaults), TITAN_<SECTION>__<KEY> variables, the flags.

    The engine flags (--model to --num-threads) set the embedded model.

    With --config they need a file with exactly one embedded deployment, which they then set.
    """
    try:
        settings = serve_settings(
            config_file=config_file,
            upstream=upstream,
            api_key=api_key,
            host=host,
            port=port,
            log_level=log_level,
            model=model,
            served_model_name=served_model_name,
            device=device,
            dtype=dtype,
            quantization=quantization,
            attention_precision=attention_precision,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            kv_cache_memory=kv_cache_memory,
            num_kv_blocks=num_kv_blocks,
            max_model_len=max_model_len,
            num_threads=num_threads,
            storage=storage,
            allow_unauthenticated=allow_unauthenticated,
        )
        exit_code = run_server(settings)
    except TitanError as exc:  # a bad flag or file, or an engine config the engine refuses
        typer.echo(f"titan serve: {exc.message}", err=True)
        raise typer.Exit(2) from None
    raise typer.Exit(exit_code)


def build_cli() -> typer.Typer:
    """The ``titan`` command (built on demand: no app objects at import)."""
    cli = typer.Typer(
        name="titan",
        help="Titan: an OpenAI-compatible LLM server that keeps steady under transients.",
        no_args_is_help=True,
        add_completion=False,
    )
    # A callback keeps `serve` a subcommand even while it is the only one.
    cli.callback()(lambda: None)
    cli.command("serve")(serve)
    cli.command("bench")(bench_url)
    cli.add_typer(config_app, name="config")
    cli.add_typer(keys_app, name="keys")
    cli.add_typer(jobs_app, name="jobs")
    cli.add_typer(storage_app, name="storage")
    cli.add_typer(cache_app, name="cache")
    cli.command("worker")(worker)
    cli.command("simulate")(simulate)
    cli.command("chaos")(chaos)
    cli.command("plan")(plan)
    return cli


def main() -> None:
    """Console-script entry point (``titan``) and ``python -m titan``."""
    build_cli()()
