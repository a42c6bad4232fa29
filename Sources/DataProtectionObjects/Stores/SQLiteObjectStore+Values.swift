import DataProtection
import DataProtectionSQLite
import Foundation
import GRDB

// SQLiteObjectStore: values.
extension SQLiteObjectStore {
    // MARK: - Values

    /// How an attribute value is bound: for storage (decimals as exact text) or for comparison.
    static func databaseValue(_ value: AttributeValue, forStorage: Bool) -> DatabaseValue {
        switch value {
        case .null: .null
        case .integer(let v): v.databaseValue
        case .boolean(let v): (v ? 1 : 0 as Int64).databaseValue
        case .double(let v): v.databaseValue
        case .date(let v): v.timeIntervalSinceReferenceDate.databaseValue
        case .decimal(let v):
            forStorage ? v.description.databaseValue : NSDecimalNumber(decimal: v).doubleValue.databaseValue
        case .string(let v): v.databaseValue
        case .url(let v): v.absoluteString.databaseValue
        case .data(let v): v.databaseValue
        case .uuid(let v): withUnsafeBytes(of: v.uuid) { Data($0) }.databaseValue
        }
    }

    func attributeValue(_ value: DatabaseValue, type: AttributeType) throws -> AttributeValue {
        switch (value.storage, type) {
        case (.null, _): return .null
        case (.int64(let v), .integer16), (.int64(let v), .integer32), (.int64(let v), .integer64): return .integer(v)
        case (.int64(let v), .boolean): return .boolean(v != 0)
        case (.double(let v), .double): return .double(v)
        case (.int64(let v), .double): return .double(Double(v))
        case (.double(let v), .date): return .date(Date(timeIntervalSinceReferenceDate: v))
        case (.int64(let v), .date): return .date(Date(timeIntervalSinceReferenceDate: Double(v)))
        case (.string(let v), .decimal):
            if let d = Decimal(string: v, locale: Locale(identifier: "en_US_POSIX")) { return .decimal(d) }
        case (.double(let v), .decimal): return .decimal(Decimal(v))
        case (.int64(let v), .decimal): return .decimal(Decimal(v))
        case (.string(let v), .string): return .string(v)
        case (.string(let v), .uri): if let url = URL(string: v) { return .url(url) }
        case (.blob(let v), .binaryData): return .data(v)
        case (.blob(let v), .uuid) where v.count == 16:
            return .uuid(v.withUnsafeBytes { UUID(uuid: $0.loadUnaligned(as: uuid_t.self)) })
        default: break
        }
        throw ObjectGraphError.damagedStore(store: path, detail: "a column holds \(value) where a \(type) was expected")
    }
}
