import DataProtection
import Foundation
import GRDB

// SQLiteObjectStore: how a row of each entity is read, worked out once per store.
extension SQLiteObjectStore {
    /// What reading a row of one entity needs, looked up once when the store opens rather than by
    /// name for every row: the entity, its columns, and each to-one's destination (with the
    /// destination root's entities by code, for a row naming a sub-entity).
    struct RowDecoding {
        let entity: Entity
        let layout: SQLiteSchema.EntityLayout
        let toOneDestinations: [Entity]
        let toOneCodes: [[Int64: Entity]]

        /// Each root table's rows by entity code.
        static func all(model: ObjectModel, schema: SQLiteSchema, entitiesByCode: [String: [Int64: Entity]]) -> [String: [Int64: RowDecoding]] {
            var plans: [String: [Int64: RowDecoding]] = [:]
            for entity in model.entities {
                guard let layout = schema.layouts[entity.name] else { continue }
                let destinations = entity.toOneRelationships.map { entity.destination(of: $0) }
                plans[entity.root, default: [:]][entity.code] = RowDecoding(
                    entity: entity, layout: layout, toOneDestinations: destinations,
                    toOneCodes: destinations.map { entitiesByCode[$0.root] ?? [:] })
            }
            return plans
        }
    }

    /// The node a row holds (`Z_PK, Z_ENT, Z_OPT` then the root table's columns), read with the
    /// root's plans.
    func decodeNode(_ row: Row, root: String, plans: [Int64: RowDecoding]) throws -> StoreNode {
        let key: Int64 = row[0]
        let code: Int64 = row[1]
        guard let plan = plans[code] else {
            throw ObjectGraphError.damagedStore(store: path, detail: "row \(key) of \(root) has unknown entity code \(code)")
        }
        let entity = plan.entity, layout = plan.layout
        var values: [AttributeValue] = []
        values.reserveCapacity(entity.attributes.count)
        for (i, attribute) in entity.attributes.enumerated() {
            values.append(try attributeValue(row[layout.attributePositions[i] + 3], type: attribute.type))
        }
        var toOne: [ObjectID?] = []
        toOne.reserveCapacity(plan.toOneDestinations.count)
        for (i, destination) in plan.toOneDestinations.enumerated() {
            guard let target: Int64 = row[layout.toOnePositions[i] + 3] else { toOne.append(nil); continue }
            var concrete = destination
            if let position = layout.toOneEntityPositions[i], let code: Int64 = row[position + 3], let named = plan.toOneCodes[i][code] {
                concrete = named
            }
            toOne.append(ObjectID(entity: concrete, primaryKey: target))
        }
        return StoreNode(objectID: ObjectID(entity: entity, primaryKey: key), values: values, toOne: toOne, version: row[2])
    }
}
