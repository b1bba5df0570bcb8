// Header facts of a JPEG read in the native threads that read it (the tar writer's workers), so that pack's Python
// validation (fastfeed/pack/validate.py) decides on a few numbers instead of walking the bytes itself.
//
// A mirror of fastfeed/image/jpeg.py `_probe_jpeg` (the marker walk up to the first SOS: the SOF segment, JFIF/Adobe
// markers, the EXIF orientation through fastfeed/image/headers.py `tiff_orientation`) and of validate.py `_tail`
// (does the file end in EOI, ignoring trailing zero/whitespace padding). The classification itself (kind, colour space,
// subsampling, what the GPU decoder takes) stays in Python: it gets the raw SOF segment. Where the Python walk would
// raise, probe_jpeg returns false and Python runs its own path on the bytes; tests/test_image_probe.py holds the two
// equal on real and mutated files. No Python headers here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace fastfeed {

struct JpegFacts {
    int sof_marker = 0;        // 0xC0..0xCF: the frame header's marker
    std::string sof_segment;   // its payload (after the length field), as jpeg.py's `_jpeg_info` takes it
    bool jfif = false;         // an APP0 "JFIF\0" marker before the first scan
    int adobe_transform = -1;  // the APP14 "Adobe" transform byte, -1 without one
    int orientation = 1;       // EXIF orientation tag 1..8 (1 when absent or malformed)
    bool ends_with_eoi = false;  // the last bytes, trailing 0x00/CR/LF/space padding ignored, are FF D9
};

// True (and `out` filled) when `data` starts with FF D8 FF and its marker walk reaches a scan with one frame header,
// exactly when jpeg.py's `_probe_jpeg` walk succeeds; false otherwise (the caller falls back to Python).
bool probe_jpeg(const std::uint8_t* data, std::size_t size, JpegFacts& out);

// fastfeed/image/headers.py `tiff_orientation` on a TIFF-structured EXIF block.
int tiff_orientation(const std::uint8_t* tiff, std::size_t size);

// True when a PNG's chunk walk succeeds, exactly when fastfeed/image/headers.py `png_facts` returns facts instead of a
// reason: IHDR first (13 bytes, a nonzero size, a known colour type), every chunk inside the data, IDAT before IEND.
// The caller has checked the 8-byte signature; the walk starts after it. (The Loader's check of bytes no checksum
// vouches for, bindings.cpp `header_failures`; pack walks PNGs in Python.)
bool png_structure_ok(const std::uint8_t* data, std::size_t size);

// The Loader's check of bytes no checksum vouches for (bindings.cpp `header_failures`): false for a JPEG (FF D8)
// that pack would refuse as it is (its header walk fails, its frame header is malformed where jpeg.py's `probe`
// raises, or it does not end in EOI, padding aside) and for a PNG (its signature) whose chunk walk fails; true for
// every other sample, which is not looked at.
bool sample_header_ok(const std::uint8_t* data, std::size_t size);

}  // namespace fastfeed
