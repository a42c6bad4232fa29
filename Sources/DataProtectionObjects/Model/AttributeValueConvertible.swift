import Foundation

/// A Swift type an attribute can hold: `Int` (and its sized variants), `Double`, `Decimal`,
/// `String`, `Bool`, `Date`, `Data`, `UUID`, `URL`, and optionals of these.
public protocol AttributeValueConvertible {
    /// The attribute type it is stored as.
    static var attributeType: AttributeType { get }
    /// Whether `nil` is a value (optionals).
    static var isOptionalAttribute: Bool { get }
    /// What a getter gives when the value cannot be loaded (see ``ObjectContext/lastFaultError``).
    static var placeholder: Self { get }
    init?(attributeValue: AttributeValue)
    var attributeValue: AttributeValue { get }
}

extension AttributeValueConvertible {
    public static var isOptionalAttribute: Bool { false }
}

extension Int: AttributeValueConvertible {
    public static var attributeType: AttributeType { .integer64 }
    public static var placeholder: Int { 0 }
    public init?(attributeValue: AttributeValue) {
        guard case .integer(let v) = attributeValue else { return nil }; self = Int(v)
    }
    public var attributeValue: AttributeValue { .integer(Int64(self)) }
}
extension Int64: AttributeValueConvertible {
    public static var attributeType: AttributeType { .integer64 }
    public static var placeholder: Int64 { 0 }
    public init?(attributeValue: AttributeValue) {
        guard case .integer(let v) = attributeValue else { return nil }; self = v
    }
    public var attributeValue: AttributeValue { .integer(self) }
}
extension Int32: AttributeValueConvertible {
    public static var attributeType: AttributeType { .integer32 }
    public static var placeholder: Int32 { 0 }
    public init?(attributeValue: AttributeValue) {
        guard case .integer(let v) = attributeValue, let x = Int32(exactly: v) else { return nil }; self = x
    }
    public var attributeValue: AttributeValue { .integer(Int64(self)) }
}
extension Int16: AttributeValueConvertible {
    public static var attributeType: AttributeType { .integer16 }
    public static var placeholder: Int16 { 0 }
    public init?(attributeValue: AttributeValue) {
        guard case .integer(let v) = attributeValue, let x = Int16(exactly: v) else { return nil }; self = x
    }
    public var attributeValue: AttributeValue { .integer(Int64(self)) }
}
extension Double: AttributeValueConvertible {
    public static var attributeType: AttributeType { .double }
    public static var placeholder: Double { 0 }
    public init?(attributeValue: AttributeValue) {
        guard case .double(let v) = attributeValue else { return nil }; self = v
    }
    public var attributeValue: AttributeValue { .double(self) }
}
extension Decimal: AttributeValueConvertible {
    public static var attributeType: AttributeType { .decimal }
    public static var placeholder: Decimal { 0 }
    public init?(attributeValue: AttributeValue) {
        guard case .decimal(let v) = attributeValue else { return nil }; self = v
    }
    public var attributeValue: AttributeValue { .decimal(self) }
}
extension String: AttributeValueConvertible {
    public static var attributeType: AttributeType { .string }
    public static var placeholder: String { "" }
    public init?(attributeValue: AttributeValue) {
        guard case .string(let v) = attributeValue else { return nil }; self = v
    }
    public var attributeValue: AttributeValue { .string(self) }
}
extension Bool: AttributeValueConvertible {
    public static var attributeType: AttributeType { .boolean }
    public static var placeholder: Bool { false }
    public init?(attributeValue: AttributeValue) {
        guard case .boolean(let v) = attributeValue else { return nil }; self = v
    }
    public var attributeValue: AttributeValue { .boolean(self) }
}
extension Date: AttributeValueConvertible {
    public static var attributeType: AttributeType { .date }
    public static var placeholder: Date { Date(timeIntervalSinceReferenceDate: 0) }
    public init?(attributeValue: AttributeValue) {
        guard case .date(let v) = attributeValue else { return nil }; self = v
    }
    public var attributeValue: AttributeValue { .date(self) }
}
extension Data: AttributeValueConvertible {
    public static var attributeType: AttributeType { .binaryData }
    public static var placeholder: Data { Data() }
    public init?(attributeValue: AttributeValue) {
        guard case .data(let v) = attributeValue else { return nil }; self = v
    }
    public var attributeValue: AttributeValue { .data(self) }
}
extension UUID: AttributeValueConvertible {
    public static var attributeType: AttributeType { .uuid }
    public static var placeholder: UUID { UUID(uuid: (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)) }
    public init?(attributeValue: AttributeValue) {
        guard case .uuid(let v) = attributeValue else { return nil }; self = v
    }
    public var attributeValue: AttributeValue { .uuid(self) }
}
extension URL: AttributeValueConvertible {
    public static var attributeType: AttributeType { .uri }
    public static var placeholder: URL { URL(string: "about:blank")! }
    public init?(attributeValue: AttributeValue) {
        guard case .url(let v) = attributeValue else { return nil }; self = v
    }
    public var attributeValue: AttributeValue { .url(self) }
}
extension Optional: AttributeValueConvertible where Wrapped: AttributeValueConvertible {
    public static var attributeType: AttributeType { Wrapped.attributeType }
    public static var isOptionalAttribute: Bool { true }
    public static var placeholder: Optional<Wrapped> { nil }
    public init?(attributeValue: AttributeValue) {
        if attributeValue.isNull { self = .none; return }
        guard let value = Wrapped(attributeValue: attributeValue) else { return nil }
        self = .some(value)
    }
    public var attributeValue: AttributeValue { self?.attributeValue ?? .null }
}

extension AttributeDescription {
    /// The description of a typed attribute: `AttributeDescription.for("sentAt", Date.self)`.
    public static func `for`<T: AttributeValueConvertible>(
        _ name: String, _ type: T.Type, default value: T? = nil,
        indexed: Bool = false
    ) -> AttributeDescription {
        AttributeDescription(
            name, T.attributeType, optional: T.isOptionalAttribute, default: value.map(\.attributeValue),
            indexed: indexed)
    }
}
