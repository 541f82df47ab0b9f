"""HANG_S: the one wall-clock bound on what the tests wait for (a subprocess, a server coming up, a request,
a line of output). It guards against a hang, not a slow machine: CI gives the whole suite 90 minutes, and a
loaded 2-core machine can take several times an idle one's time for the same work."""

HANG_S = 30 * 60
