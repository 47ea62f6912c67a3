// Shared types of the window detector: points to cluster, their weights, partitions.
//
// A clusterer sees n points in d dimensions (one row per point, rank-major like the
// rest of the engine) with a positive weight each. A weight w stands for w identical
// points: the ensemble clusters a weighted summary of the ranks (coreset.h), and every
// algorithm here treats weights exactly that way, so weight 1 everywhere gives the
// textbook unweighted algorithm.
#pragma once

#include <Eigen/Dense>
#include <cstdint>
#include <vector>

namespace relax_straggler::core::detect {

using PointMatrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;  // n x d
using Weights = Eigen::VectorXd;                                                               // n, > 0
using Labels = std::vector<std::int32_t>;  // n, cluster id >= 0, or kNoise

// DBSCAN's label for a point in no cluster.
constexpr std::int32_t kNoise = -1;

// n x n Euclidean distances (symmetric, zero diagonal), computed with one matrix
// product: |a - b|^2 = |a|^2 + |b|^2 - 2 a.b, clamped at 0 against rounding.
Eigen::MatrixXd pairwise_distances(const PointMatrix& x);

// Per point and per k in ks, the smallest radius whose ball (the point itself included)
// holds weight >= k: the k-th nearest-neighbour distance counting the point, weights as
// multiplicity; the largest distance when the total weight is below k. Returns n x
// ks.size(). distances: n x n. O(n^2 + n k log k) for weights >= 1, O(n^2 log n) otherwise.
Eigen::MatrixXd k_distances(const Eigen::MatrixXd& distances, const Weights& w, const std::vector<double>& ks);

// Number of distinct non-noise labels, assuming labels are 0..k-1 (or kNoise).
std::int32_t count_clusters(const Labels& labels);

// Relabels clusters to 0..k-1 in order of first appearance, keeping kNoise; returns k.
std::int32_t compact_labels(Labels& labels);

}  // namespace relax_straggler::core::detect
