"""pgvector's types on every pooled connection, with the same adapter classes each time.

pgvector.psycopg's `register_*_info` make two dumper classes for a type each time they
run (`type('', ...)`, to carry the type's oid), and psycopg keeps every dumper class a
connection registers in a process-wide map for good (`AdaptersMap._optimised`). Called on
every new connection, as `register_vector_async` in a pool's `configure` is, that grew
serve by about 25 KiB per connection: 0.23 MiB each time a database restart or
`pg_terminate_backend` made its pool reconnect (bench.soak on Citus, where no pgbouncer
keeps serve's connections open through those faults). psycopg caches the array adapters
it generates by oid for the same reason (psycopg.types.array).

Here pgvector's own registration runs once per set of type oids, against a recorder; every
new connection replays what it recorded, with the same classes: nothing grows, whatever
the number of reconnects."""

from __future__ import annotations

from typing import Any

from pgvector.psycopg.bit import register_bit_info
from pgvector.psycopg.halfvec import register_halfvec_info
from pgvector.psycopg.sparsevec import register_sparsevec_info
from pgvector.psycopg.vector import register_vector_info
from psycopg import AsyncConnection, ProgrammingError
from psycopg.adapt import AdaptersMap
from psycopg.types import TypeInfo

# As pgvector's register_vector_async: `vector` must exist (ProgrammingError when it
# does not), `bit` is Postgres's own, the others come with
# pgvector 0.7 and are left out where the extension is older.
_REGISTER = {
    "vector": register_vector_info,
    "bit": register_bit_info,
    "halfvec": register_halfvec_info,
    "sparsevec": register_sparsevec_info,
}
_OPTIONAL = frozenset({"halfvec", "sparsevec"})

# (kind, key, value): ("type", None, TypeInfo), ("dumper", python type, Dumper class),
# ("loader", oid, Loader class); in the order registered.
_Call = tuple[str, Any, Any]
_RECORDED: dict[tuple[tuple[str, int, int], ...], list[_Call]] = {}


class _Recorder:
    """What pgvector's and psycopg's register functions touch of an adaptation context
    (`context.adapters`, its `types`, register_dumper, register_loader), written down."""

    def __init__(self) -> None:
        self.calls: list[_Call] = []

    @property
    def adapters(self) -> _Recorder:
        return self

    @property
    def types(self) -> _Recorder:
        return self

    @property
    def connection(self) -> None:
        return None

    def add(self, info: TypeInfo) -> None:
        self.calls.append(("type", None, info))

    def register_dumper(self, cls: Any, dumper: Any) -> None:
        self.calls.append(("dumper", cls, dumper))

    def register_loader(self, oid: Any, loader: Any) -> None:
        self.calls.append(("loader", oid, loader))


async def register_vector_types(conn: AsyncConnection[Any]) -> None:
    """What `pgvector.psycopg.register_vector_async(conn)` does, with adapter classes
    made once per set of type oids in this process."""
    infos: dict[str, TypeInfo] = {}
    for name in _REGISTER:
        info = await TypeInfo.fetch(conn, name)
        if info is not None:
            infos[name] = info
        elif name not in _OPTIONAL:
            raise ProgrammingError(f"{name} type not found in the database")  # pgvector's words
    key = tuple((name, info.oid, info.array_oid) for name, info in infos.items())
    calls = _RECORDED.get(key)
    if calls is None:
        recorder = _Recorder()
        for name, info in infos.items():
            _REGISTER[name](recorder, info)  # type: ignore[arg-type]
        calls = _RECORDED.setdefault(key, recorder.calls)
    _replay(calls, conn.adapters)


def _replay(calls: list[_Call], adapters: AdaptersMap) -> None:
    for kind, key, value in calls:
        if kind == "type":
            adapters.types.add(value)
        elif kind == "dumper":
            adapters.register_dumper(key, value)
        else:
            adapters.register_loader(key, value)
