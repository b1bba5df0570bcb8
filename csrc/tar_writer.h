// Native tar shard writer: reads source files on worker threads, frames them as ustar members, checksums each
// member (xxh3_64) and the whole archive (sha256), all without Python. No Python headers here (bindings.cpp owns
// the GIL policy).
//
// NOTE [ Native tar writer ]
// --------------------------
// Format. Byte-identical to fastfeed/pack/writers.py: per member a 512-byte ustar header (mode 0644, uid/gid 0,
// mtime 0, typeflag '0', magic "ustar\0" version "00", checksum written "%06o\0 "), the data, zero padding to a
// multiple of 512; the archive ends with 1024 zero bytes. Names are at most 100 bytes (the caller validates).
//
// Samples. add() takes a list of samples, each a list of members (a source file to read, or bytes to store). A
// sample is written all or nothing: if any of its files cannot be opened or read whole (missing, not a regular
// file, I/O error, changed size while read), none of its members is written and its result carries the error and
// errno. Results are in input order; member offsets are of the data (not the header) inside the archive.
//
// Threads and order. Worker threads take chunks of kChunk consecutive samples strictly in input order and build
// each sample's complete record (headers, data, padding, xxh3) in a buffer from a pool; then the same worker waits
// for its turn (every earlier chunk written) and writes the chunk itself (one writev). Writing on the thread that
// read keeps the bytes in that core's cache: the copy into the page cache from buffers another core filled costs
// several times as much (benchmarks/README.md, pack). Reads of later chunks
// overlap the write of this one, and the archive is in input order whatever the thread count. Workers run at most
// kMaxAhead chunks and kMaxBytesAhead bytes past the chunk being written (the next one may always proceed, so a
// huge file cannot deadlock the window); the window is small on purpose, for the same cache reason. A hash thread
// runs sha256 over the written buffers in write order and returns them to the pool.
//
// Checks. With a check, the calling thread runs it on each sample in order once its chunk is read; the chunk's
// worker waits for the decisions before writing. Python (the binding's check) therefore only ever runs on the
// calling thread.
//
// Probe. With TarProbe::enabled, the worker that read a sample also reads its first member's JPEG header
// (image_probe.h: SOF, JFIF/Adobe, EXIF orientation, ends in EOI) and, with scan_check, runs the JPEG scan check
// (jpeg_transcode.h check_jpeg_scans) on it, and hands both to the check: the per-file byte work of pack's
// validation runs on the parallel reader threads, the calling thread only decides. The scan check is run only where
// its answer is used: a probed 8-bit JPEG that ends in EOI.
//
// Durability. finish(sync=true) fsyncs; it releases the GIL, so the Python side runs it on a helper thread while
// the next shard is written (fastfeed/pack/native.py write_shards). Writeback is deliberately not started early
// (e.g. sync_file_range after each write): on a disk slower than packing, it blocks the writing thread in
// the device queue and caps packing at disk speed, where the page cache would otherwise absorb the shard.
//
// Errors. A failed write (ENOSPC, EIO) is fatal for the writer: add() and finish() throw std::system_error and
// later calls throw too; the partial file is the caller's to delete (abort()).
//
// Shutdown. finish() (end marker, sha256, optional fsync, close) or abort() (close) stop and join the threads;
// the destructor calls abort(). Every wait is on a condition variable that stop_ breaks.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <sys/uio.h>
#include <thread>
#include <vector>

#include "image_probe.h"

namespace fastfeed {

struct TarMember {
    std::string name;               // member name inside the archive (<= 100 bytes, no NUL)
    std::string path;               // read this file when non-empty ...
    const uint8_t* data = nullptr;  // ... else store these bytes (must stay valid during add())
    size_t size = 0;
};

struct TarSample {
    std::vector<TarMember> members;
};

struct TarMemberResult {
    int64_t offset = -1;  // of the member's data inside the archive
    int64_t size = 0;
    uint64_t xxh3 = 0;    // XXH3_64bits of the stored data (seed 0): what xxhash.xxh3_64_intdigest returns
};

// What the workers found out about a sample's first member (TarProbe).
struct SampleProbe {
    bool jpeg = false;  // probe_jpeg succeeded: `facts` holds the header
    JpegFacts facts;
    enum Scan { Unchecked, Clean, Corrupt } scan = Unchecked;
    std::string scan_error;  // Corrupt: libjpeg's message
};

struct TarProbe {
    bool enabled = false;
    bool scan_check = false;  // needs libjpeg (have_libjpeg()); ignored without it
};

struct TarSampleResult {
    SampleProbe probe;  // when the add() call asked for it and the sample was read
    bool ok = false;
    int err = 0;        // errno of the failure (0 when ok)
    std::string error;  // names the file and says what went wrong
    std::vector<TarMemberResult> members;
};

// What a check (run on the calling thread before sample j is written) decides about the sample's first member.
struct TarCheck {
    enum Kind { Keep, Drop, Replace } kind = Keep;
    std::string reason;          // Drop: why (becomes the sample's error, errno 0)
    std::string name;            // Replace: the member's new name (e.g. another extension)
    std::vector<uint8_t> data;   // Replace: the bytes to store instead
};
using SharedBytes = std::shared_ptr<uint8_t[]>;
// (sample index, the buffer holding the first member's data, its offset and size in it, what the probe found (null
// without a probe), decision). A check may keep its reference to the buffer past the call: a buffer it still holds
// is never reused, only released.
using TarCheckFn = std::function<void(size_t, const SharedBytes&, size_t, size_t, const SampleProbe*, TarCheck&)>;

class TarWriter {
public:
    static constexpr size_t kBlock = 512;

    // Creates (truncates) `path`. num_threads 0: one per CPU (at most 16).
    TarWriter(const std::string& path, size_t num_threads);
    ~TarWriter();
    TarWriter(const TarWriter&) = delete;
    TarWriter& operator=(const TarWriter&) = delete;

    // `check` (may be empty) runs on the calling thread for each readable sample, in order, before it is written;
    // if it throws, the writer becomes unusable (some samples of this call were written, the rest not).
    std::vector<TarSampleResult> add(const std::vector<TarSample>& samples, const TarCheckFn& check = {},
                                     const TarProbe& probe = {});
    // End marker, wait for the hash, fsync (when asked), close. Returns the archive's sha256 as 64 hex digits.
    std::string finish(bool sync);
    void abort();

    uint64_t bytes_written() const { return pos_; }
    size_t num_threads() const { return workers_.size(); }

    static size_t padded(size_t n) { return (n + kBlock - 1) / kBlock * kBlock; }

private:
    struct Buf {
        SharedBytes p;
        size_t cap = 0;
        size_t len = 0;
    };
    struct Work {
        bool done = false;     // read (or failed); under mu_
        bool checked = false;  // the check decided; under mu_
        Buf buf;
    };
    struct Job {
        const std::vector<TarSample>* samples = nullptr;
        std::vector<TarSampleResult>* results = nullptr;
        std::vector<Work>* work = nullptr;
        size_t n = 0;
        size_t chunks = 0;  // tasks: runs of kChunk consecutive samples
        bool has_check = false;
        TarProbe probe;
    };
    struct HashBatch {
        std::vector<Buf> bufs;
        bool final = false;
    };

    // A worker's task is kChunk consecutive samples (~0.5 MB of typical JPEGs): one turn hand-off and one writev per
    // chunk rather than per sample. Hand-offs are wake-ups, and on a busy machine each costs a scheduling delay.
    static constexpr size_t kChunk = 4;
    static constexpr size_t kMaxAhead = 16;  // chunks
    static constexpr size_t kMaxBytesAhead = size_t{2} << 20;

    void worker_loop();
    void hash_loop();
    void prepare(const TarSample& s, TarSampleResult& r, Buf& buf, const TarProbe& probe);
    void apply_check(TarSampleResult& r, Buf& buf, TarCheck& c);
    Buf get_buf(size_t need);
    void put_buf(Buf b);
    void write_all(std::vector<Buf>& bufs);
    int write_fully(std::vector<iovec>& iov);  // 0 or errno; consumes iov
    void push_hash(std::vector<Buf> bufs, bool final = false);
    void check_usable() const;
    void stop_threads();

    std::string path_;
    int fd_ = -1;
    std::atomic<uint64_t> pos_{0};  // read by bytes_written() from any thread
    std::atomic<bool> failed_{false};
    bool finished_ = false;

    std::mutex mu_;
    std::condition_variable work_cv_;  // workers: a job, room ahead, stop
    std::condition_variable done_cv_;  // caller: a sample is ready
    Job job_;
    size_t next_task_ = 0;
    size_t next_write_ = 0;
    size_t bytes_ahead_ = 0;  // capacity of buffers taken by workers and not yet back in the pool
    size_t job_finished_ = 0;  // chunks of this job written or dropped
    bool abort_job_ = false;   // a check raised or a write failed: drop what is not written yet
    int write_errno_ = 0;
    bool stop_ = false;
    std::vector<std::thread> workers_;

    std::mutex pool_mu_;
    std::vector<Buf> pool_;
    size_t pool_bytes_ = 0;

    std::mutex hash_mu_;
    std::condition_variable hash_cv_;
    std::deque<HashBatch> hash_q_;
    bool hash_stop_ = false;
    bool digest_ready_ = false;
    std::string digest_hex_;
    std::string hash_error_;
    std::thread hasher_;
};

bool have_tar_writer();

}  // namespace fastfeed
