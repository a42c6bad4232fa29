import Foundation

/// The events in the bytes one `read` of an inotify descriptor returned (`struct
/// inotify_event`: watch descriptor, mask, cookie, name length, then the NUL-padded name, in
/// the machine's byte order): each event's watch and the name it concerns.
func inotifyEvents(_ buffer: [UInt8], count: Int) -> [(watch: Int32, name: String)] {
    func field(_ offset: Int) -> UInt32 {
        buffer.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: offset, as: UInt32.self) }
    }
    var events: [(watch: Int32, name: String)] = []
    var offset = 0
    while offset + 16 <= count {
        let length = Int(field(offset + 12))
        let name = String(
            decoding: buffer[(offset + 16)..<min(count, offset + 16 + length)].prefix { $0 != 0 }, as: UTF8.self)
        events.append((Int32(bitPattern: field(offset)), name))
        offset += 16 + length
    }
    return events
}
