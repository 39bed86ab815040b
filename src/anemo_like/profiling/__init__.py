"""Profiling: memory readings (more to come: snapshots, per-phase reports)."""

from anemo_like.profiling.memory import current_rss_mib, peak_rss_mib, reset_peak_rss

__all__ = ["current_rss_mib", "peak_rss_mib", "reset_peak_rss"]
