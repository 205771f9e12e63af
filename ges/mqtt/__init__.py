"""MQTT at the edge (issue 23): a sans-I/O codec for MQTT 3.1.1 and 5.0 — bytes in, packets
out — that the trio runtime will drive."""
