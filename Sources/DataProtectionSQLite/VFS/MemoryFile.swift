import Foundation
import GRDBSQLite

/// A temporary file that never touches the disk: temp databases, statement journals, the
/// sorter's spill files, VACUUM's copy. Its bytes are zeroed when SQLite closes it.
final class MemoryFile: VFSFile {
    private var bytes: [UInt8] = []

    override func close() -> Int32 {
        _ = bytes.withUnsafeMutableBytes { $0.initializeMemory(as: UInt8.self, repeating: 0) }
        bytes = []
        return SQLITE_OK
    }

    override func read(_ buffer: UnsafeMutableRawBufferPointer, at offset: Int64) -> Int32 {
        let start = Int(offset)
        let available = max(0, min(buffer.count, bytes.count - start))
        if available > 0 {
            bytes.withUnsafeBytes {
                buffer.baseAddress!.copyMemory(from: $0.baseAddress! + start, byteCount: available)
            }
        }
        if available < buffer.count {
            (buffer.baseAddress! + available).initializeMemory(
                as: UInt8.self, repeating: 0, count: buffer.count - available)
            return SQLITE_IOERR_SHORT_READ
        }
        return SQLITE_OK
    }

    override func write(_ buffer: UnsafeRawBufferPointer, at offset: Int64) -> Int32 {
        let end = Int(offset) + buffer.count
        if end > bytes.count { bytes.append(contentsOf: repeatElement(0, count: end - bytes.count)) }
        bytes.withUnsafeMutableBytes {
            $0.baseAddress!.advanced(by: Int(offset)).copyMemory(from: buffer.baseAddress!, byteCount: buffer.count)
        }
        return SQLITE_OK
    }

    override func truncate(_ size: Int64) -> Int32 {
        if Int(size) < bytes.count {
            _ = bytes.withUnsafeMutableBytes {
                UnsafeMutableRawBufferPointer(rebasing: $0[Int(size)...]).initializeMemory(as: UInt8.self, repeating: 0)
            }
            bytes.removeLast(bytes.count - Int(size))
        }
        return SQLITE_OK
    }

    override func fileSize(_ out: UnsafeMutablePointer<sqlite3_int64>) -> Int32 {
        out.pointee = sqlite3_int64(bytes.count)
        return SQLITE_OK
    }
}
