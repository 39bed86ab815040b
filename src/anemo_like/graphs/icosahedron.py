"""Icosahedral meshes refined by splitting every triangle into four."""

from dataclasses import dataclass

import numpy as np

_GOLDEN_RATIO = (1.0 + 5.0**0.5) / 2.0


@dataclass(frozen=True)
class RefinedIcosahedron:
    """Nested triangular meshes on the unit sphere.

    vertices: float64 (10·4^r + 2, 3) unit vectors. Refinement only appends midpoints, so the
        level-l vertices are rows 0 .. 10·4^l + 1 for every level l <= r.
    faces_per_level: entry l is int64 (20·4^l, 3), the vertex indices of the level-l triangles.
    """

    vertices: np.ndarray
    faces_per_level: tuple[np.ndarray, ...]

    @property
    def resolution(self) -> int:
        """Number of refinements r applied to the icosahedron."""
        return len(self.faces_per_level) - 1


def icosahedron() -> tuple[np.ndarray, np.ndarray]:
    """Regular icosahedron: unit vertices float64 (12, 3) and faces int64 (20, 3).

    Vertices are the cyclic permutations of (0, ±1, ±φ); faces are the vertex triples that are
    pairwise at the minimal (edge) distance.
    """
    signs = np.array([[-1.0, -1.0], [-1.0, 1.0], [1.0, -1.0], [1.0, 1.0]])
    golden_rectangle = np.column_stack([np.zeros(4), signs[:, 0], signs[:, 1] * _GOLDEN_RATIO])
    vertices = np.concatenate([np.roll(golden_rectangle, shift, axis=1) for shift in range(3)])
    vertices /= np.linalg.norm(vertices, axis=1, keepdims=True)

    distances = np.linalg.norm(vertices[:, None, :] - vertices[None, :, :], axis=-1)
    adjacent = np.isclose(distances, distances[distances > 0].min())
    first, second, third = np.nonzero(adjacent[:, :, None] & adjacent[:, None, :] & adjacent[None, :, :])
    ordered = (first < second) & (second < third)
    faces = np.column_stack([first[ordered], second[ordered], third[ordered]]).astype(np.int64)
    return vertices, faces


def triangle_edges(faces: np.ndarray, num_vertices: int) -> tuple[np.ndarray, np.ndarray]:
    """Unique undirected edges of triangles (F, 3) over `num_vertices` vertices.

    Returns the edges int64 (E, 2) with column 0 < column 1, sorted, and for every face the
    index into those edges of its sides (v0, v1), (v1, v2), (v2, v0) as int64 (F, 3).
    """
    sides = np.stack([faces[:, [0, 1]], faces[:, [1, 2]], faces[:, [2, 0]]], axis=1)
    keys = sides.min(axis=-1) * num_vertices + sides.max(axis=-1)
    unique_keys, side_to_edge = np.unique(keys.ravel(), return_inverse=True)
    edges = np.column_stack([unique_keys // num_vertices, unique_keys % num_vertices])
    return edges, side_to_edge.reshape(faces.shape)


def refine(vertices: np.ndarray, faces: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Split each triangle into four; edge midpoints are projected to the sphere and appended.

    vertices: (V, 3) unit vectors, faces: (F, 3). Returns (V + E, 3) vertices and (4F, 3) faces.
    """
    num_vertices = len(vertices)
    edges, side_to_edge = triangle_edges(faces, num_vertices)
    midpoints = vertices[edges[:, 0]] + vertices[edges[:, 1]]
    midpoints /= np.linalg.norm(midpoints, axis=1, keepdims=True)

    mid_01, mid_12, mid_20 = (num_vertices + side_to_edge).T
    corner_0, corner_1, corner_2 = faces.T
    refined_faces = np.concatenate(
        [
            np.column_stack([corner_0, mid_01, mid_20]),
            np.column_stack([corner_1, mid_12, mid_01]),
            np.column_stack([corner_2, mid_20, mid_12]),
            np.column_stack([mid_01, mid_12, mid_20]),
        ]
    )
    return np.concatenate([vertices, midpoints]), refined_faces


def refined_icosahedron(*, resolution: int) -> RefinedIcosahedron:
    """The icosahedron refined `resolution` times, keeping the faces of every level."""
    if resolution < 0:
        raise ValueError(f"resolution must be >= 0, got {resolution}")
    vertices, faces = icosahedron()
    faces_per_level = [faces]
    for _ in range(resolution):
        vertices, faces = refine(vertices, faces)
        faces_per_level.append(faces)
    return RefinedIcosahedron(vertices=vertices, faces_per_level=tuple(faces_per_level))
