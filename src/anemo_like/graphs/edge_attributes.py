"""Edge features: great-circle length and local direction, normalised to unit standard deviation."""

import numpy as np

from anemo_like.sphere import great_circle_distance, xyz_to_latlon


def edge_directions(source_xyz: np.ndarray, destination_xyz: np.ndarray) -> np.ndarray:
    """Unit 2-D direction float64 (E, 2) of each source (E, 3) as seen from its destination (E, 3).

    The sphere is rotated so that the destination sits at the north pole (rotate about z by -lon,
    then about y by lat - pi/2) and the (x, y) components of the rotated source are normalised.
    In that frame a source due east of the destination gives (0, 1) and due north gives (-1, 0).
    Coincident points give (0, 0).
    """
    latitudes, longitudes = xyz_to_latlon(destination_xyz).T
    cos_lon, sin_lon = np.cos(longitudes), np.sin(longitudes)
    x_after_z_rotation = source_xyz[:, 0] * cos_lon + source_xyz[:, 1] * sin_lon
    y_after_z_rotation = -source_xyz[:, 0] * sin_lon + source_xyz[:, 1] * cos_lon
    rotated_x = x_after_z_rotation * np.sin(latitudes) - source_xyz[:, 2] * np.cos(latitudes)
    directions = np.stack([rotated_x, y_after_z_rotation], axis=-1)
    norms = np.linalg.norm(directions, axis=-1, keepdims=True)
    return np.divide(directions, norms, out=np.zeros_like(directions), where=norms > 0)


def unit_std(features: np.ndarray) -> np.ndarray:
    """Divide every column of (E, C) by its standard deviation; columns with zero std are left as they are."""
    if len(features) == 0:
        return features
    std = features.std(axis=0)
    return features / np.where(std > 0, std, 1.0)


def edge_attributes(source_xyz: np.ndarray, destination_xyz: np.ndarray, edge_index: np.ndarray) -> np.ndarray:
    """float32 (E, 3) = [length (rad), direction_x, direction_y], each column divided by its std.

    source_xyz / destination_xyz: unit vectors of all source / destination nodes; edge_index (2, E).
    """
    edge_sources = source_xyz[edge_index[0]]
    edge_destinations = destination_xyz[edge_index[1]]
    lengths = great_circle_distance(edge_sources, edge_destinations)
    directions = edge_directions(edge_sources, edge_destinations)
    return unit_std(np.column_stack([lengths, directions])).astype(np.float32)
