"""The HNSW indexes' DDL, for every index dwsearch builds: the opt-in index over one
model's windows (dwsearch.search.store.knn.create_hnsw_index) and an org's own index
(dwsearch.search.knnindex.build_org_index). A partial index over a halfvec cast of the
column, by inner product (halfvec_ip_ops), which dwsearch.retrieval.store.nearest's
hnsw_ranked scans; built CONCURRENTLY, so sweeps and searches go on while it builds."""

from __future__ import annotations

from psycopg import AsyncConnection, sql


def create_statement(
    name: str, *, table: str, column: str, dimension: int, where: sql.Composable, m: int, ef_construction: int
) -> sql.Composed:
    """CREATE INDEX CONCURRENTLY IF NOT EXISTS over `column` cast to halfvec(`dimension`),
    limited to the rows matching `where` (its values SQL literals: only a predicate on
    constants proves a partial index's)."""
    return sql.SQL(
        """CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON {table}
           USING hnsw (({column}::halfvec({dim})) halfvec_ip_ops) WITH (m = {m}, ef_construction = {efc})
           WHERE {where}"""
    ).format(
        name=sql.Identifier(name),
        table=sql.Identifier(table),
        column=sql.Identifier(column),
        dim=sql.Literal(int(dimension)),
        m=sql.Literal(int(m)),
        efc=sql.Literal(int(ef_construction)),
        where=where,
    )


async def valid(conn: AsyncConnection, name: str) -> bool | None:
    """Whether the index `name` is valid; None when there is none. A build that failed or
    was interrupted leaves an invalid index behind, which IF NOT EXISTS would keep."""
    cur = await conn.execute("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)", (name,))
    row = await cur.fetchone()
    return None if row is None else bool(row[0])


async def drop(conn: AsyncConnection, name: str) -> None:
    """DROP INDEX CONCURRENTLY IF EXISTS (conn in autocommit)."""
    await conn.execute(sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}").format(sql.Identifier(name)))
