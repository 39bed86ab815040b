"""Profiling: ``anemo-profile`` (per-phase time and memory of training steps, operator tables, the report),
the doctor that turns a profile into advice, and ``anemo-bench``'s throughput in three modes (loading alone,
compute alone, both) with the knob to turn next."""
