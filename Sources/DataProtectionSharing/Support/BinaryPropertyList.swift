import Foundation

/// `value` as a binary property list: every record and answer the broker writes (FORMAT.md §11).
func binaryPropertyList(_ value: some Encodable) throws -> [UInt8] {
    let encoder = PropertyListEncoder()
    encoder.outputFormat = .binary
    return Array(try encoder.encode(value))
}
