"""``titan``: the command line (typer). Sync at this edge; everything below it is async."""

from __future__ import annotations

import importlib.util
from typing import Annotated

import typer
from pydantic import ValidationError

from titan.cli.bench import bench_app
from titan.config import EmbeddedModelConfig, ServerConfig, TitanConfig, parse_byte_size
from titan.errors import ConfigError, TitanError

# Long uvicorn shutdowns hold a deploy back; streams still open after this are cut.
GRACEFUL_SHUTDOWN_S = 10


def build_config(
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    log_level: str = "info",
    model: str | None = None,
    served_model_name: str | None = None,
    device: str | None = None,
    dtype: str | None = None,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    kv_cache_memory: str | None = None,
    num_kv_blocks: int | None = None,
    max_model_len: int | None = None,
    num_threads: int | None = None,
) -> TitanConfig:
    """The config the serve flags describe. Raises ConfigError naming the bad flag."""
    try:
        return TitanConfig(
            server=ServerConfig(host=host, port=port, log_level=log_level.lower()),
            embedded=EmbeddedModelConfig(
                model=model,
                served_model_name=served_model_name,
                device=device,
                dtype=dtype,
                max_num_seqs=max_num_seqs,
                max_num_batched_tokens=max_num_batched_tokens,
                kv_cache_bytes=parse_byte_size(kv_cache_memory) if kv_cache_memory else None,
                num_kv_blocks=num_kv_blocks,
                max_model_len=max_model_len,
                num_threads=num_threads,
            ),
        )
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        flag = "--" + str(error["loc"][-1]).replace("_", "-") if error["loc"] else "a flag"
        raise ConfigError(f"invalid value for {flag}: {error['msg']}") from None


def run_server(config: TitanConfig) -> int:
    """Serve until interrupted; returns the process exit code (1 if the models failed to load)."""
    # Imported here so that `titan --help` stays quick.
    import uvicorn

    from titan.api import create_app
    from titan.observability import configure_logging

    configure_logging(config.server.log_level)
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
            http="httptools" if importlib.util.find_spec("httptools") else "h11",
            workers=1,
            lifespan="on",
            log_config=None,  # configure_logging already set up JSON logs for uvicorn too
            log_level=config.server.log_level,
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        )
    )
    server.run()
    return exit_code


def serve(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    model: Annotated[
        str | None,
        typer.Option(
            help="A .gguf file or an HF model directory (default: SmolLM2-135M-Instruct)."
        ),
    ] = None,
    served_model_name: Annotated[
        str | None, typer.Option(help="The model id clients use (default: from the model).")
    ] = None,
    device: Annotated[str | None, typer.Option(help="auto, cpu, cuda or cuda:N.")] = None,
    dtype: Annotated[str | None, typer.Option(help="auto, float32, bfloat16 or float16.")] = None,
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
        int | None, typer.Option(help="Torch threads for the engine (default: cores - 1).")
    ] = None,
    log_level: Annotated[
        str, typer.Option(help="debug, info, warning, error or critical.")
    ] = "info",
) -> None:
    """Serve the OpenAI-compatible API with the embedded model."""
    try:
        config = build_config(
            host=host,
            port=port,
            log_level=log_level,
            model=model,
            served_model_name=served_model_name,
            device=device,
            dtype=dtype,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            kv_cache_memory=kv_cache_memory,
            num_kv_blocks=num_kv_blocks,
            max_model_len=max_model_len,
            num_threads=num_threads,
        )
        exit_code = run_server(config)
    except TitanError as exc:  # a bad flag, or an engine config the engine refuses
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
    cli.add_typer(bench_app, name="bench")
    return cli


def main() -> None:
    """Console-script entry point (``titan``) and ``python -m titan``."""
    build_cli()()
