// See NOTE [ Native tar writer ] in tar_writer.h.
#include "tar_writer.h"
#include "jpeg_transcode.h"
#include "ustar.h"
#include "xxh3.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <system_error>

#ifdef FASTFEED_HAVE_OPENSSL
#include <openssl/evp.h>
#endif

namespace fastfeed {
namespace {

struct Fd {
    int fd = -1;
    ~Fd() {
        if (fd >= 0) ::close(fd);
    }
};

std::string reason(const std::string& path, const char* what, int err) {
    return path + ": " + what + (err ? std::string(": ") + std::strerror(err) : std::string());
}

}  // namespace

bool have_tar_writer() {
#ifdef FASTFEED_HAVE_OPENSSL
    return true;
#else
    return false;
#endif
}

TarWriter::TarWriter(const std::string& path, size_t num_threads) : path_(path) {
    if (!have_tar_writer()) throw std::runtime_error("fastfeed._native was built without OpenSSL (sha256)");
    if (num_threads == 0) num_threads = std::min<size_t>(std::max(1u, std::thread::hardware_concurrency()), 16);
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) throw std::system_error(errno, std::generic_category(), "cannot create " + path);
    try {
        hasher_ = std::thread([this] { hash_loop(); });
        for (size_t t = 0; t < num_threads; ++t) workers_.emplace_back([this] { worker_loop(); });
    } catch (...) {
        abort();
        throw;
    }
}

TarWriter::~TarWriter() { abort(); }

void TarWriter::check_usable() const {
    if (finished_) throw std::runtime_error("the tar writer is finished: " + path_);
    if (failed_) throw std::runtime_error("an earlier write failed; the shard is unusable: " + path_);
}

void TarWriter::stop_threads() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
    }
    work_cv_.notify_all();
    done_cv_.notify_all();
    for (auto& t : workers_)
        if (t.joinable()) t.join();
    {
        std::lock_guard<std::mutex> lock(hash_mu_);
        hash_stop_ = true;
    }
    hash_cv_.notify_all();
    if (hasher_.joinable()) hasher_.join();
}

void TarWriter::abort() {
    stop_threads();
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    finished_ = true;
}

TarWriter::Buf TarWriter::get_buf(size_t need) {
    {
        std::lock_guard<std::mutex> lock(pool_mu_);
        size_t best = pool_.size();
        for (size_t i = 0; i < pool_.size(); ++i)
            if (pool_[i].cap >= need && (best == pool_.size() || pool_[i].cap < pool_[best].cap)) best = i;
        if (best < pool_.size()) {
            Buf b = std::move(pool_[best]);
            pool_[best] = std::move(pool_.back());
            pool_.pop_back();
            pool_bytes_ -= b.cap;
            return b;
        }
    }
    // Rounded up so buffers are reusable for similar sizes; new memory faults in once, reused memory does not.
    Buf b;
    b.cap = std::max<size_t>((need + 0xFFFF) & ~size_t{0xFFFF}, 0x10000);
    b.p = SharedBytes(new uint8_t[b.cap]);
    return b;
}

void TarWriter::put_buf(Buf b) {
    // A buffer a check still references (a Python view of it) is only released: its bytes must stay as they are.
    if (!b.p || b.p.use_count() > 1) return;
    std::lock_guard<std::mutex> lock(pool_mu_);
    if (pool_bytes_ + b.cap > 2 * kMaxBytesAhead) return;  // freed: the pool never holds more than twice the window
    pool_bytes_ += b.cap;
    pool_.push_back(std::move(b));
}

namespace {

void probe_first_member(const uint8_t* data, size_t size, const TarProbe& probe, SampleProbe& out) {
    out.jpeg = probe_jpeg(data, size, out.facts);
    // The scan check only where validate.py uses its answer: an 8-bit JPEG (SOF precision byte) ending in EOI.
    if (!out.jpeg || !probe.scan_check || !have_libjpeg() || !out.facts.ends_with_eoi ||
        out.facts.sof_segment.empty() || static_cast<uint8_t>(out.facts.sof_segment[0]) != 8)
        return;
    try {
        out.scan_error = check_jpeg_scans(ByteSpan{data, size});
        out.scan = out.scan_error.empty() ? SampleProbe::Clean : SampleProbe::Corrupt;
    } catch (const std::exception&) {
        out.scan = SampleProbe::Unchecked;  // out of memory: validate.py runs the check itself
    }
}

}  // namespace

void TarWriter::prepare(const TarSample& s, TarSampleResult& r, Buf& buf, const TarProbe& probe) {
    const size_t m = s.members.size();
    std::vector<Fd> fds(m);
    std::vector<uint64_t> sizes(m);
    for (size_t i = 0; i < m; ++i) {
        const TarMember& mem = s.members[i];
        if (mem.path.empty()) {
            sizes[i] = mem.size;
            continue;
        }
        // O_NONBLOCK: opening a FIFO must not block; it is then refused as not a regular file.
        fds[i].fd = ::open(mem.path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
        if (fds[i].fd < 0) {
            r.err = errno;
            r.error = reason(mem.path, "cannot open", r.err);
            return;
        }
        struct stat st {};
        if (::fstat(fds[i].fd, &st) != 0) {
            r.err = errno;
            r.error = reason(mem.path, "cannot stat", r.err);
            return;
        }
        if (!S_ISREG(st.st_mode)) {
            r.err = EINVAL;
            r.error = reason(mem.path, "not a regular file", 0);
            return;
        }
        sizes[i] = static_cast<uint64_t>(st.st_size);
    }
    size_t total = 1;  // one spare byte: a read of size + 1 tells a file that grew since fstat
    for (size_t i = 0; i < m; ++i) {
        if (sizes[i] > ustar::kMaxSize) {
            r.err = EFBIG;
            r.error = reason(s.members[i].path.empty() ? s.members[i].name : s.members[i].path,
                             "too large for a ustar member (8 GiB)", 0);
            return;
        }
        total += kBlock + padded(static_cast<size_t>(sizes[i]));
    }
    buf = get_buf(total);
    {
        std::lock_guard<std::mutex> lock(mu_);
        bytes_ahead_ += buf.cap;
    }
    size_t pos = 0;
    r.members.resize(m);
    for (size_t i = 0; i < m; ++i) {
        const TarMember& mem = s.members[i];
        const size_t want = static_cast<size_t>(sizes[i]);
        uint8_t* data = buf.p.get() + pos + kBlock;
        if (mem.path.empty()) {
            if (want) std::memcpy(data, mem.data, want);
        } else {
            size_t got = 0;
            while (got <= want) {  // up to want + 1 bytes
                ssize_t n = ::read(fds[i].fd, data + got, want + 1 - got);
                if (n < 0) {
                    if (errno == EINTR || errno == EAGAIN) continue;
                    r.err = errno;
                    r.error = reason(mem.path, "read failed", r.err);
                    r.members.clear();
                    return;
                }
                if (n == 0) break;
                got += static_cast<size_t>(n);
            }
            if (got != want) {
                r.err = EIO;
                r.error = reason(mem.path, got > want ? "file changed while reading (grew)"
                                                      : "file changed while reading (shrank)", 0);
                r.members.clear();
                return;
            }
        }
        ustar::put_header(buf.p.get() + pos, mem.name, sizes[i]);
        std::memset(data + want, 0, padded(want) - want);
        r.members[i].offset = static_cast<int64_t>(pos + kBlock);  // relative to the record; the caller rebases
        r.members[i].size = static_cast<int64_t>(want);
        r.members[i].xxh3 = xxh3_64(data, want);
        pos += kBlock + padded(want);
    }
    buf.len = pos;
    r.ok = true;
    if (probe.enabled && m > 0)
        probe_first_member(buf.p.get() + kBlock, static_cast<size_t>(r.members[0].size), probe, r.probe);
}

void TarWriter::worker_loop() {
    std::unique_lock<std::mutex> lock(mu_);
    std::vector<iovec> iov;
    while (true) {
        work_cv_.wait(lock, [this] {
            if (stop_) return true;
            if (abort_job_ || !job_.samples || next_task_ >= job_.chunks) return false;
            if (next_task_ == next_write_) return true;  // the chunk to write next always proceeds
            return next_task_ < next_write_ + kMaxAhead && bytes_ahead_ < kMaxBytesAhead;
        });
        if (stop_) return;
        const size_t c = next_task_++;
        const Job job = job_;
        lock.unlock();
        const size_t begin = c * kChunk, end = std::min(job.n, begin + kChunk);
        for (size_t j = begin; j < end; ++j)
            prepare((*job.samples)[j], (*job.results)[j], (*job.work)[j].buf, job.probe);
        lock.lock();
        for (size_t j = begin; j < end; ++j) (*job.work)[j].done = true;
        if (job.has_check) done_cv_.notify_all();
        // Our turn: every earlier chunk is written (and this one checked). This thread read the bytes, so they
        // are still in this core's cache for the copy into the page cache.
        work_cv_.wait(lock, [&] {
            return stop_ || abort_job_ || (next_write_ == c && (!job.has_check || (*job.work)[end - 1].checked));
        });
        std::vector<Buf> written, dropped;
        int err = 0;
        if (!stop_ && !abort_job_) {
            lock.unlock();
            iov.clear();
            uint64_t pos = pos_.load();
            for (size_t j = begin; j < end; ++j) {
                TarSampleResult& r = (*job.results)[j];
                Buf& b = (*job.work)[j].buf;
                if (!r.ok) continue;
                for (auto& mr : r.members) mr.offset += static_cast<int64_t>(pos);
                pos += b.len;
                iov.push_back({b.p.get(), b.len});
            }
            err = write_fully(iov);
            for (size_t j = begin; j < end; ++j) {
                Buf& b = (*job.work)[j].buf;
                if (b.p) ((*job.results)[j].ok && !err ? written : dropped).push_back(std::move(b));
            }
            if (!err) {
                pos_ = pos;
                if (!written.empty()) push_hash(std::move(written));
            }
            lock.lock();
        } else {
            for (size_t j = begin; j < end; ++j)
                if ((*job.work)[j].buf.p) dropped.push_back(std::move((*job.work)[j].buf));
        }
        for (auto& b : dropped) {  // not written: failed samples, an aborted job or a failed write
            bytes_ahead_ -= std::min(bytes_ahead_, b.cap);
            put_buf(std::move(b));
        }
        if (err) {
            abort_job_ = true;
            failed_ = true;
            write_errno_ = err;
        }
        if (next_write_ == c) next_write_ = c + 1;
        ++job_finished_;
        work_cv_.notify_all();
        done_cv_.notify_all();
    }
}

int TarWriter::write_fully(std::vector<iovec>& iov) {
    size_t k = 0;
    while (k < iov.size()) {
        ssize_t n = ::writev(fd_, iov.data() + k, static_cast<int>(std::min<size_t>(iov.size() - k, 1024)));
        if (n < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        if (n == 0) return EIO;
        size_t left = static_cast<size_t>(n);
        while (k < iov.size() && left >= iov[k].iov_len) left -= iov[k++].iov_len;
        if (left) {
            iov[k].iov_base = static_cast<uint8_t*>(iov[k].iov_base) + left;
            iov[k].iov_len -= left;
        }
    }
    return 0;
}

void TarWriter::push_hash(std::vector<Buf> bufs, bool final) {
    HashBatch batch;
    batch.bufs = std::move(bufs);
    batch.final = final;
    {
        std::lock_guard<std::mutex> lock(hash_mu_);
        hash_q_.push_back(std::move(batch));
    }
    hash_cv_.notify_one();
}

void TarWriter::write_all(std::vector<Buf>& bufs) {
    std::vector<iovec> iov;
    for (auto& b : bufs)
        if (b.len) iov.push_back({b.p.get(), b.len});
    const int err = write_fully(iov);
    if (err) {
        failed_ = true;
        throw std::system_error(err, std::generic_category(), "write to " + path_ + " failed");
    }
}

void TarWriter::apply_check(TarSampleResult& r, Buf& buf, TarCheck& c) {
    if (c.kind == TarCheck::Keep) return;
    if (c.kind == TarCheck::Drop) {
        r = TarSampleResult{};
        r.error = c.reason.empty() ? std::string("rejected by the check") : c.reason;
        return;
    }
    // Replace the first member: new header and data, then the other members' bytes as they were (records hold
    // no absolute offsets, so they move as a block).
    if (c.name.empty() || c.name.size() > 100 || c.name.find('\0') != std::string::npos)
        throw std::invalid_argument("replacement member name must be 1..100 bytes without NUL: " + c.name);
    if (c.data.size() > ustar::kMaxSize) throw std::invalid_argument("replacement too large for ustar: " + c.name);
    const size_t old_first = kBlock + padded(static_cast<size_t>(r.members[0].size));
    const size_t rest = buf.len - old_first;
    const size_t first = kBlock + padded(c.data.size());
    Buf nb = get_buf(first + rest);
    ustar::put_header(nb.p.get(), c.name, c.data.size());
    if (!c.data.empty()) std::memcpy(nb.p.get() + kBlock, c.data.data(), c.data.size());
    std::memset(nb.p.get() + kBlock + c.data.size(), 0, first - kBlock - c.data.size());
    if (rest) std::memcpy(nb.p.get() + first, buf.p.get() + old_first, rest);
    nb.len = first + rest;
    r.members[0].size = static_cast<int64_t>(c.data.size());
    r.members[0].xxh3 = xxh3_64(c.data.data(), c.data.size());
    for (size_t k = 1; k < r.members.size(); ++k)
        r.members[k].offset += static_cast<int64_t>(first) - static_cast<int64_t>(old_first);
    {
        std::lock_guard<std::mutex> lock(mu_);
        bytes_ahead_ += nb.cap;
        bytes_ahead_ -= std::min(bytes_ahead_, buf.cap);
    }
    put_buf(std::move(buf));
    buf = std::move(nb);
}

std::vector<TarSampleResult> TarWriter::add(const std::vector<TarSample>& samples, const TarCheckFn& check,
                                            const TarProbe& probe) {
    check_usable();
    const size_t n = samples.size();
    std::vector<TarSampleResult> results(n);
    std::vector<Work> work(n);
    {
        std::lock_guard<std::mutex> lock(mu_);
        job_ = Job{&samples, &results, &work, n, (n + kChunk - 1) / kChunk, static_cast<bool>(check), probe};
        next_task_ = next_write_ = job_finished_ = 0;
        abort_job_ = false;
    }
    work_cv_.notify_all();
    std::exception_ptr check_error;
    const bool job_probe = probe.enabled;
    if (check) {
        // The workers wait for each sample's decision before writing it; the check runs here, on the caller's
        // thread, in order, while they read ahead.
        for (size_t begin = 0; begin < n && !check_error; begin += kChunk) {
            const size_t end = std::min(n, begin + kChunk);
            {
                std::unique_lock<std::mutex> lock(mu_);
                done_cv_.wait(lock, [&] { return work[end - 1].done || abort_job_ || stop_; });
                if (abort_job_ || stop_) break;
            }
            for (size_t j = begin; j < end && !check_error; ++j) {
                TarSampleResult& r = results[j];
                try {
                    if (r.ok && !r.members.empty()) {
                        TarCheck c;
                        check(j, work[j].buf.p, static_cast<size_t>(r.members[0].offset),
                              static_cast<size_t>(r.members[0].size), job_probe ? &r.probe : nullptr, c);
                        apply_check(r, work[j].buf, c);
                    }
                } catch (...) {
                    check_error = std::current_exception();
                }
            }
            std::lock_guard<std::mutex> lock(mu_);
            if (check_error) {
                abort_job_ = true;
                failed_ = true;
            }
            for (size_t j = begin; j < end; ++j) work[j].checked = true;
            work_cv_.notify_all();
        }
    }
    int write_errno = 0;
    {
        // Every task taken is finished (written or dropped) before the job's vectors go out of scope.
        std::unique_lock<std::mutex> lock(mu_);
        done_cv_.wait(lock, [&] {
            return stop_ || (job_finished_ == next_task_ && (next_task_ == job_.chunks || abort_job_));
        });
        job_ = Job{};
        write_errno = write_errno_;
        if (stop_ && !abort_job_) failed_ = true;
    }
    if (check_error) std::rethrow_exception(check_error);
    if (write_errno) throw std::system_error(write_errno, std::generic_category(), "write to " + path_ + " failed");
    if (failed_) throw std::runtime_error("the tar writer was stopped during add(): " + path_);
    return results;
}

void TarWriter::hash_loop() {
#ifdef FASTFEED_HAVE_OPENSSL
    EVP_MD_CTX* ctx = EVP_MD_CTX_new();
    bool ok = ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr) == 1;
    while (true) {
        HashBatch batch;
        {
            std::unique_lock<std::mutex> lock(hash_mu_);
            hash_cv_.wait(lock, [this] { return hash_stop_ || !hash_q_.empty(); });
            if (hash_q_.empty()) break;  // stopped and drained
            batch = std::move(hash_q_.front());
            hash_q_.pop_front();
        }
        size_t returned = 0;
        for (auto& b : batch.bufs) {
            if (ok && b.len) ok = EVP_DigestUpdate(ctx, b.p.get(), b.len) == 1;
            returned += b.cap;
            put_buf(std::move(b));
        }
        {
            std::lock_guard<std::mutex> lock(mu_);
            bytes_ahead_ -= std::min(bytes_ahead_, returned);
        }
        work_cv_.notify_all();
        if (batch.final) {
            unsigned char md[EVP_MAX_MD_SIZE];
            unsigned int len = 0;
            std::string hex;
            if (ok && EVP_DigestFinal_ex(ctx, md, &len) == 1) {
                static const char* digits = "0123456789abcdef";
                for (unsigned i = 0; i < len; ++i) {
                    hex += digits[md[i] >> 4];
                    hex += digits[md[i] & 15];
                }
            }
            std::lock_guard<std::mutex> lock(hash_mu_);
            if (hex.empty()) hash_error_ = "sha256 (OpenSSL EVP) failed";
            digest_hex_ = hex;
            digest_ready_ = true;
            hash_cv_.notify_all();
        }
    }
    EVP_MD_CTX_free(ctx);
#endif
}

std::string TarWriter::finish(bool sync) {
    check_usable();
    std::vector<Buf> end(1);
    end[0].cap = end[0].len = 2 * kBlock;
    end[0].p = SharedBytes(new uint8_t[end[0].cap]());
    {
        std::lock_guard<std::mutex> lock(mu_);
        bytes_ahead_ += end[0].cap;
    }
    write_all(end);
    pos_ += 2 * kBlock;
    push_hash(std::move(end), true);
    std::string hex, err;
    {
        std::unique_lock<std::mutex> lock(hash_mu_);
        hash_cv_.wait(lock, [this] { return digest_ready_; });
        hex = digest_hex_;
        err = hash_error_;
    }
    if (sync && ::fsync(fd_) != 0) {
        failed_ = true;
        throw std::system_error(errno, std::generic_category(), "fsync of " + path_ + " failed");
    }
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) {
        failed_ = true;
        throw std::system_error(errno, std::generic_category(), "close of " + path_ + " failed");
    }
    stop_threads();
    finished_ = true;
    if (!err.empty()) throw std::runtime_error(err + ": " + path_);
    return hex;
}

}  // namespace fastfeed
