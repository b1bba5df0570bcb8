"""Images as bytes, never decoded here: JPEG/PNG structure (headers.py), what an image is and whether the GPU's
hardware decoder takes it (jpeg.py), and what pack stores instead of what it does not (transcode.py)."""
