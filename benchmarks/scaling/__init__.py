"""Cost against grid size, sharding over ranks, every command on an operational-size grid."""
