"""A tiny static HTTP server that honours Range requests (aiohttp), for the example.

    python examples/serve.py DIRECTORY PORT_FILE

Listens on 127.0.0.1 on a free port and writes the port number to PORT_FILE once it is ready.
"""

import asyncio
import sys
from pathlib import Path

from aiohttp import web


async def main(root: Path, port_file: Path) -> None:
    app = web.Application()
    app.router.add_static("/", root)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    port_file.write_text(str(port))
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), Path(sys.argv[2])))
