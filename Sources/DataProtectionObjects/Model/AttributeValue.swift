import Foundation

/// The type of an attribute, as in CoreData's `NSAttributeDescription.AttributeType`.
public enum AttributeType: String, Sendable, Hashable, Codable, CaseIterable {
    case integer16, integer32, integer64, double, decimal, string, boolean, date, binaryData, uuid, uri

    /// The SQLite column type (affinity) the attribute is stored with.
    var sqlType: String {
        switch self {
        case .integer16, .integer32, .integer64, .boolean: "INTEGER"
        case .double, .date: "REAL"
        case .decimal, .string, .uri: "TEXT"
        case .binaryData, .uuid: "BLOB"
        }
    }
}

/// One attribute's value, typed. `null` stands for a missing value of an optional attribute.
///
/// Values order like SQLite orders the columns they are stored in (NULL first, numbers by
/// value, text by its UTF-8 bytes, blobs by their bytes), so the in-memory store and the
/// SQLite store sort and compare alike.
public enum AttributeValue: Sendable, Hashable, CustomStringConvertible {
    case null
    case integer(Int64)
    case double(Double)
    case decimal(Decimal)
    case string(String)
    case boolean(Bool)
    case date(Date)
    case data(Data)
    case uuid(UUID)
    case url(URL)

    public var isNull: Bool { if case .null = self { true } else { false } }

    public var description: String {
        switch self {
        case .null: "nil"
        case .integer(let v): "\(v)"
        case .double(let v): "\(v)"
        case .decimal(let v): "\(v)"
        case .string(let v): "\"\(v)\""
        case .boolean(let v): "\(v)"
        case .date(let v): "\(v.timeIntervalSinceReferenceDate)"
        case .data(let v): "<\(v.count) bytes>"
        case .uuid(let v): v.uuidString
        case .url(let v): v.absoluteString
        }
    }

    /// Whether the value can be stored in an attribute of `type`.
    func fits(_ type: AttributeType) -> Bool {
        switch (self, type) {
        case (.null, _): true
        case (.integer(let v), .integer16): v >= Int64(Int16.min) && v <= Int64(Int16.max)
        case (.integer(let v), .integer32): v >= Int64(Int32.min) && v <= Int64(Int32.max)
        case (.integer, .integer64), (.double, .double), (.decimal, .decimal), (.string, .string),
            (.boolean, .boolean), (.date, .date), (.data, .binaryData), (.uuid, .uuid), (.url, .uri):
            true
        default: false
        }
    }

    /// The value as SQLite stores it: numbers, text or bytes.
    var storage: StorageValue {
        switch self {
        case .null: .null
        case .integer(let v): .integer(v)
        case .boolean(let v): .integer(v ? 1 : 0)
        case .double(let v): .real(v)
        case .date(let v): .real(v.timeIntervalSinceReferenceDate)
        case .decimal(let v): .real(NSDecimalNumber(decimal: v).doubleValue)
        case .string(let v): .text(v)
        case .url(let v): .text(v.absoluteString)
        case .data(let v): .blob(v)
        case .uuid(let v): .blob(withUnsafeBytes(of: v.uuid) { Data($0) })
        }
    }

    /// Orders two values as SQLite's default (BINARY) collation does; `nil` when either is NULL
    /// (an SQL comparison with NULL is unknown).
    static func compare(_ lhs: AttributeValue, _ rhs: AttributeValue) -> ComparisonResult? {
        if lhs.isNull || rhs.isNull { return nil }
        return StorageValue.compare(lhs.storage, rhs.storage)
    }

    /// Orders for sorting: NULL first, then as ``compare(_:_:)``.
    static func sortOrder(_ lhs: AttributeValue, _ rhs: AttributeValue) -> ComparisonResult {
        switch (lhs.isNull, rhs.isNull) {
        case (true, true): .orderedSame
        case (true, false): .orderedAscending
        case (false, true): .orderedDescending
        case (false, false): StorageValue.compare(lhs.storage, rhs.storage)
        }
    }
}

/// A value as SQLite holds it, and SQLite's ordering of such values.
enum StorageValue: Hashable {
    case null, integer(Int64), real(Double), text(String), blob(Data)

    private var rank: Int {
        switch self {
        case .null: 0;
        case .integer, .real: 1;
        case .text: 2;
        case .blob: 3
        }
    }

    static func compare(_ lhs: StorageValue, _ rhs: StorageValue) -> ComparisonResult {
        switch (lhs, rhs) {
        case (.integer(let a), .integer(let b)):
            return a < b ? .orderedAscending : a > b ? .orderedDescending : .orderedSame
        case (.integer(let a), .real(let b)): return order(Double(a), b)
        case (.real(let a), .integer(let b)): return order(a, Double(b))
        case (.real(let a), .real(let b)): return order(a, b)
        case (.text(let a), .text(let b)): return bytes(a.utf8, b.utf8)
        case (.blob(let a), .blob(let b)): return bytes(a, b)
        default:
            return lhs.rank < rhs.rank ? .orderedAscending : lhs.rank > rhs.rank ? .orderedDescending : .orderedSame
        }
    }

    private static func order(_ a: Double, _ b: Double) -> ComparisonResult {
        a < b ? .orderedAscending : a > b ? .orderedDescending : .orderedSame
    }

    private static func bytes<A: Sequence<UInt8>, B: Sequence<UInt8>>(_ a: A, _ b: B) -> ComparisonResult {
        var i = a.makeIterator(), j = b.makeIterator()
        while true {
            switch (i.next(), j.next()) {
            case (nil, nil): return .orderedSame
            case (nil, _): return .orderedAscending
            case (_, nil): return .orderedDescending
            case (let x?, let y?): if x != y { return x < y ? .orderedAscending : .orderedDescending }
            }
        }
    }
}
