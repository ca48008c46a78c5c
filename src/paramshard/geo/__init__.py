"""GEO-SGD (``--mode geo``): each trainer trains a local replica and every k steps sends the
change of what it touched (``geo/`` holds the parts that are GEO's own: when to send,
``schedule.py``; the trainer side is ``trainer/backends/geo.py``)."""
