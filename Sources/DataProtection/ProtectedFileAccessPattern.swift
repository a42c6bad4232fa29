/// How a new protected file will be used. It sets the size of the encrypted segments the file
/// is cut into, which is recorded in the file's header: files of every segment size are read
/// and written the same way, whatever the current defaults.
///
/// A read decrypts whole segments and a write re-seals them, so the size is a trade: small
/// segments make a 4 KiB read cost one 4 KiB decryption (fscrypt and gocryptfs use 4 KiB
/// units), large ones cut the per-segment cost of streaming through a file (age uses 64 KiB).
///
/// ```swift
/// try await files.write(video, to: url, protection: .complete)                       // .sequential
/// let index = try await files.createFile(at: indexURL, protection: .complete)          // .randomAccess
/// try await files.write(pages, to: cacheURL, protection: .complete, access: .randomAccess)
/// ```
public enum ProtectedFileAccessPattern: Sendable, Hashable {
    /// Written and read front to back, mostly whole: documents, media, downloads. 64 KiB
    /// segments (``ProtectedFileManager/segmentSizeLog2``), the fastest sequential I/O. The
    /// default of ``ProtectedFileManager/write(_:to:protection:thisDeviceOnly:access:)`` and
    /// ``ProtectedFileManager/write(contentsOf:to:protection:thisDeviceOnly:access:)``.
    case sequential
    /// Read and written at offsets: indexes, caches, journals, logs that grow by small appends.
    /// 4 KiB segments (``ProtectedFileManager/randomAccessSegmentSizeLog2``), so a 4 KiB read
    /// decrypts 4 KiB and a small write re-seals 4 KiB. The default of
    /// ``ProtectedFileManager/createFile(at:protection:thisDeviceOnly:access:)``, which opens a
    /// handle for exactly that.
    case randomAccess
}
