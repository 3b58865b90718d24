"""The console's Map: an org's conversation windows, or an Index namespace's documents, as
points on a plane.

`org_windows` and `namespace_documents` read at most `limit` rows (the most recent:
MAX_POINTS unless asked for fewer) with their dense vectors through the domain
(dwsearch.sweep.overview.org_windows, dwsearch.index.reads.recent_documents: one statement
that names the org or the namespace, so that on a Citus cluster it is one shard's), on the
read pool. `project` is a principal component analysis (PCA): the SVD of the centered
vectors, each row's coordinates on the first two components, scaled to [-1, 1]. A
component's sign is fixed (its largest coordinate positive), so the same rows draw the
same map every time. It runs off the event loop (dwsearch.common.offload): 2,000 rows of
1,024 dimensions take a fraction of a second."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
from numpy.typing import NDArray

from dwsearch.common import offload
from dwsearch.index import reads
from dwsearch.sweep import overview

MAX_POINTS = 2000
"""The most points a map holds (the most recent rows)."""
SNIPPET_CHARS = 240
"""The characters of a point's text the map sends (its hover text)."""


@dataclass(frozen=True)
class Projection:
    points: list[dict[str, Any]]  # {id, x, y, text, channel, time}, most recent first
    truncated: bool  # more rows than the limit: the older ones are not drawn
    explained: list[float]  # the share of the variance each axis holds

    def as_json(self) -> dict[str, Any]:
        return {"points": self.points, "truncated": self.truncated, "explained": self.explained}


def project(vectors: NDArray[Any]) -> tuple[NDArray[np.float64], list[float]]:
    """Each row's coordinates on the first two principal components (n × 2, in [-1, 1]),
    and the share of the variance each component explains. Deterministic: a component's
    sign makes its largest-magnitude coordinate positive."""
    n = vectors.shape[0]
    if n < 2:
        return np.zeros((n, 2)), [0.0, 0.0]
    centered = vectors.astype(np.float64) - vectors.astype(np.float64).mean(axis=0)
    _, singular, components = np.linalg.svd(centered, full_matrices=False)
    axes = np.zeros((2, vectors.shape[1]))
    for k in range(min(2, components.shape[0])):
        component = components[k]
        if singular[k] <= 1e-12:
            continue  # no spread along it: every point at 0
        top = int(np.argmax(np.abs(component)))
        axes[k] = component if component[top] >= 0 else -component
    coordinates = centered @ axes.T
    scale = float(np.abs(coordinates).max())
    if scale > 0:
        coordinates /= scale
    variance = singular**2
    total = float(variance.sum())
    explained = [float(variance[k] / total) if total > 0 and k < len(variance) else 0.0 for k in range(2)]
    return coordinates, explained


def _projection(rows: list[tuple[Any, ...]], limit: int) -> Projection:
    """The rows (id, channel, time, text, vector) as points; runs in the offload pool."""
    truncated = len(rows) > limit
    rows = rows[:limit]
    if rows:  # one model's vectors share a dimension; any other row is left out
        dimension = rows[0][4].dimensions()
        rows = [r for r in rows if r[4].dimensions() == dimension]
    if not rows:
        return Projection([], truncated, [0.0, 0.0])
    vectors = np.array([r[4].to_numpy() for r in rows], dtype=np.float32)
    coordinates, explained = project(vectors)
    points = [
        {
            "id": row_id,
            "x": round(float(x), 5),
            "y": round(float(y), 5),
            "text": text,
            "channel": channel,
            "time": time.isoformat() if isinstance(time, datetime) else "",
        }
        for (row_id, channel, time, text, _), (x, y) in zip(rows, coordinates, strict=True)
    ]
    return Projection(points, truncated, explained)


async def org_windows(pool: Any, org_id: str, model: str, limit: int = MAX_POINTS) -> Projection:
    """The org's `limit` most recent windows of `model`, projected (pool: the read pool)."""
    # One row more than the limit: whether older rows were left out.
    rows = await overview.org_windows(pool, org_id, model, limit=limit + 1, snippet=SNIPPET_CHARS)
    return await offload.run(_projection, rows, limit)


async def namespace_documents(pool: Any, namespace: str, model: str, limit: int = MAX_POINTS) -> Projection:
    """The Index namespace's `limit` most recently updated documents of `model`, projected."""
    rows = await reads.recent_documents(pool, namespace, model, limit=limit + 1, snippet=SNIPPET_CHARS)
    return await offload.run(_projection, rows, limit)
