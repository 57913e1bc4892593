"""Operator commands: import a CSV file of codes (with a progress bar) and rotate encryption keys.

    python -m codepool import --product <product id> [--batch-ref REF] [--addr HOST:PORT] codes.csv
    python -m codepool rotate [--product <product id>] [--batch-size 1000]
"""
from __future__ import annotations

import argparse
import asyncio
import pathlib
import sys

import grpc
from tqdm import tqdm

from cuty.codepool.v1 import codepool_pb2 as pb, codepool_pb2_grpc
from cutylib.config import Settings, database_url_for, grpc_addr_for
from cutylib.errors import DomainError, InvalidArgument
from cutylib.fields import parse_uuid
from cutylib.grpc_client import create_channel
from cutylib.tls import Transport

from . import csvfile


async def import_csv(addr: str, product_id: str, path: str | pathlib.Path, *, batch_ref: str = "",
                     chunk: int = 5000, progress_file=None, deadline_seconds: float = 3600,
                     transport: Transport | None = None) -> pb.ImportCodesResponse:
    """Check the whole file first (malformed lines -> InvalidArgument naming them), then stream it.
    The server imports all of it or nothing, so an interrupted upload leaves no trace.

    Runs as the code pool's own identity (its certificate, in its pod): the call acts as `system`,
    for any merchant; the codes go to the product's merchant, which the product id names."""
    parse_uuid("product_id", product_id)
    path = pathlib.Path(path)
    check = csvfile.check_file(path)
    check.raise_if_bad(str(path))
    if check.codes == 0:
        raise InvalidArgument("file", f"{path} holds no codes")
    batch_ref = batch_ref or path.name
    bar = tqdm(total=check.codes, unit="code", unit_scale=True, desc=f"import {path.name}",
               file=progress_file or sys.stderr)

    def messages():
        for i, codes in enumerate(csvfile.read_codes(path, chunk)):
            yield pb.ImportCodesChunk(product_id=product_id if i == 0 else "", batch_ref=batch_ref if i == 0 else "",
                                      codes=codes)
            bar.update(len(codes))

    try:
        transport = transport or Transport.from_env("codepool")
        async with create_channel(addr, "codepool", transport, deadline_seconds=deadline_seconds) as channel:
            return await codepool_pb2_grpc.CodePoolServiceStub(channel).ImportCodes(messages())
    finally:
        bar.close()


async def rotate_keys(product: str | None, batch_size: int) -> int:
    from .bootstrap import check_hash_key, create_codepool_pool, load_keyring
    from .rotate import remaining, rotate

    keyring = load_keyring(Settings.from_env())
    product_id = parse_uuid("product", product) if product else None
    # Re-encrypts every merchant's codes: the pool of the service's own paths (every merchant).
    pool = await create_codepool_pool(database_url_for("codepool"), Settings.from_env(), min_size=1, max_size=2,
                                      application_name="cuty-codepool-rotate")
    try:
        await check_hash_key(pool, keyring)
        with tqdm(total=await remaining(pool, keyring, product_id), unit="code", desc=f"rotate to {keyring.active}") as bar:
            result = await rotate(pool, keyring, batch_size=batch_size, product_id=product_id, progress=bar.update)
    finally:
        await pool.close()
    print(f"rotated {result.rotated} codes to key {keyring.active!r} in {result.passes} pass(es); "
          f"{result.remaining} left under older keys")
    return 0 if result.remaining == 0 else 1


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m codepool", description="Code pool operator commands "
                                     "(without a command: serve gRPC).")
    sub = parser.add_subparsers(dest="command", required=True)
    imp = sub.add_parser("import", help="import a CSV file of codes into a product (all or nothing)")
    imp.add_argument("--product", required=True, help="product id (UUID)")
    imp.add_argument("--batch-ref", default="", help="supplier batch reference (default: the file name)")
    imp.add_argument("--addr", default=grpc_addr_for("codepool"), help="code pool gRPC address")
    imp.add_argument("--chunk", type=int, default=5000, help="codes per stream message")
    imp.add_argument("file")
    rot = sub.add_parser("rotate", help="re-encrypt codes under the active key of CUTY_CODE_KEYS")
    rot.add_argument("--product", default=None, help="only this product's codes")
    rot.add_argument("--batch-size", type=int, default=1000)
    args = parser.parse_args(argv)
    try:
        if args.command == "rotate":
            return asyncio.run(rotate_keys(args.product, args.batch_size))
        resp = asyncio.run(import_csv(args.addr, args.product, args.file, batch_ref=args.batch_ref, chunk=args.chunk))
    except DomainError as e:
        field = f" ({e.field})" if e.field else ""
        print(f"{e.code.name}{field}: {e.message}", file=sys.stderr)
        return 2
    except grpc.aio.AioRpcError as e:
        print(f"{e.code().name}: {e.details()}", file=sys.stderr)
        return 1
    if not resp.accepted:
        print(f"refused: {resp.rejected_duplicates} of {resp.received} codes are duplicates; nothing imported",
              file=sys.stderr)
        return 1
    print(f"imported {resp.imported} codes as batch {resp.batch_id}")
    return 0
