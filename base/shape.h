#pragma once
// Note [Small shapes]
// A tensor's shape: its dimensions, row-major. Every tensor, every recorded node (its output and
// each input's metadata) and every saved tensor holds one, and most have at most four dimensions,
// so Shape keeps up to kInline of them inside itself and allocates only beyond: making a tensor or
// recording an op copies several shapes, and a heap allocation and free for each cost the host
// more than the copy. Otherwise it behaves as the std::vector<std::int64_t> it stands for (and
// converts to and from one): contiguous, iterators that are pointers, the same members.
#include <algorithm>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <iterator>
#include <stdexcept>
#include <vector>
#include "graphward/base/config.h"

namespace graphward {

class Shape {
 public:
  using value_type = std::int64_t;
  using size_type = std::size_t;
  using difference_type = std::ptrdiff_t;
  using reference = std::int64_t&;
  using const_reference = const std::int64_t&;
  using pointer = std::int64_t*;
  using const_pointer = const std::int64_t*;
  using iterator = std::int64_t*;
  using const_iterator = const std::int64_t*;
  using reverse_iterator = std::reverse_iterator<iterator>;
  using const_reverse_iterator = std::reverse_iterator<const_iterator>;
  static constexpr size_type kInline = 6;

  Shape() noexcept {}
  Shape(std::initializer_list<std::int64_t> dims) { assign(dims.begin(), dims.end()); }
  explicit Shape(size_type n, std::int64_t value = 0) { assign(n, value); }
  template <std::input_iterator It>
  Shape(It first, It last) {
    assign(first, last);
  }
  Shape(const std::vector<std::int64_t>& dims) { assign(dims.begin(), dims.end()); }  // NOLINT
  Shape(const Shape& other) { assign(other.begin(), other.end()); }
  Shape(Shape&& other) noexcept { take(other); }
  Shape& operator=(const Shape& other) {
    if (this != &other) assign(other.begin(), other.end());
    return *this;
  }
  Shape& operator=(Shape&& other) noexcept {
    if (this != &other) {
      free_heap();
      take(other);
    }
    return *this;
  }
  Shape& operator=(std::initializer_list<std::int64_t> dims) {
    assign(dims.begin(), dims.end());
    return *this;
  }
  ~Shape() { free_heap(); }
  operator std::vector<std::int64_t>() const { return {begin(), end()}; }  // NOLINT

  size_type size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  size_type capacity() const noexcept { return cap_; }
  std::int64_t* data() noexcept { return data_; }
  const std::int64_t* data() const noexcept { return data_; }
  iterator begin() noexcept { return data_; }
  iterator end() noexcept { return data_ + size_; }
  const_iterator begin() const noexcept { return data_; }
  const_iterator end() const noexcept { return data_ + size_; }
  const_iterator cbegin() const noexcept { return data_; }
  const_iterator cend() const noexcept { return data_ + size_; }
  reverse_iterator rbegin() noexcept { return reverse_iterator(end()); }
  reverse_iterator rend() noexcept { return reverse_iterator(begin()); }
  const_reverse_iterator rbegin() const noexcept { return const_reverse_iterator(end()); }
  const_reverse_iterator rend() const noexcept { return const_reverse_iterator(begin()); }
  std::int64_t& operator[](size_type i) noexcept { return data_[i]; }
  const std::int64_t& operator[](size_type i) const noexcept { return data_[i]; }
  std::int64_t& at(size_type i) {
    if (i >= size_) throw std::out_of_range("Shape::at: dimension out of range");
    return data_[i];
  }
  const std::int64_t& at(size_type i) const {
    if (i >= size_) throw std::out_of_range("Shape::at: dimension out of range");
    return data_[i];
  }
  std::int64_t& front() noexcept { return data_[0]; }
  const std::int64_t& front() const noexcept { return data_[0]; }
  std::int64_t& back() noexcept { return data_[size_ - 1]; }
  const std::int64_t& back() const noexcept { return data_[size_ - 1]; }

  void reserve(size_type n) {
    if (n > cap_) grow(n);
  }
  void clear() noexcept { size_ = 0; }
  void resize(size_type n, std::int64_t value = 0) {
    reserve(n);
    for (size_type i = size_; i < n; ++i) data_[i] = value;
    size_ = static_cast<std::uint32_t>(n);
  }
  void push_back(std::int64_t value) {
    if (size_ == cap_) grow(size_ + 1);
    data_[size_++] = value;
  }
  std::int64_t& emplace_back(std::int64_t value) {
    push_back(value);
    return back();
  }
  void pop_back() noexcept { --size_; }
  void assign(size_type n, std::int64_t value) {
    size_ = 0;
    resize(n, value);
  }
  template <std::input_iterator It>
  void assign(It first, It last) {
    size_ = 0;
    if constexpr (std::forward_iterator<It>) {
      reserve(static_cast<size_type>(std::distance(first, last)));
    }
    for (; first != last; ++first) push_back(static_cast<std::int64_t>(*first));
  }
  void assign(std::initializer_list<std::int64_t> dims) { assign(dims.begin(), dims.end()); }
  iterator insert(const_iterator pos, std::int64_t value) {
    return insert(pos, size_type{1}, value);
  }
  iterator insert(const_iterator pos, size_type n, std::int64_t value) {
    const size_type at = open(pos, n);
    std::fill_n(data_ + at, n, value);
    return data_ + at;
  }
  template <std::forward_iterator It>
  iterator insert(const_iterator pos, It first, It last) {
    const Shape copy(first, last);  // `first` may point into this shape
    const size_type at = open(pos, copy.size());
    std::copy(copy.begin(), copy.end(), data_ + at);
    return data_ + at;
  }
  iterator insert(const_iterator pos, std::initializer_list<std::int64_t> dims) {
    return insert(pos, dims.begin(), dims.end());
  }
  iterator erase(const_iterator pos) { return erase(pos, pos + 1); }
  iterator erase(const_iterator first, const_iterator last) {
    const auto at = static_cast<size_type>(first - data_);
    const auto n = static_cast<size_type>(last - first);
    std::copy(data_ + at + n, data_ + size_, data_ + at);
    size_ -= static_cast<std::uint32_t>(n);
    return data_ + at;
  }
  void swap(Shape& other) noexcept {
    Shape tmp(std::move(other));
    other = std::move(*this);
    *this = std::move(tmp);
  }

  friend bool operator==(const Shape& a, const Shape& b) noexcept {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }
  friend bool operator==(const Shape& a, const std::vector<std::int64_t>& b) noexcept {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }
  friend std::strong_ordering operator<=>(const Shape& a, const Shape& b) noexcept {
    return std::lexicographical_compare_three_way(a.begin(), a.end(), b.begin(), b.end());
  }

 private:
  bool on_heap() const noexcept { return data_ != inline_; }
  void free_heap() noexcept {
    if (on_heap()) delete[] data_;
    data_ = inline_;
    cap_ = kInline;
  }
  // Steals `other`'s heap buffer or copies its inline dimensions; `other` is left empty.
  void take(Shape& other) noexcept {
    if (other.on_heap()) {
      data_ = other.data_;
      cap_ = other.cap_;
      other.data_ = other.inline_;
      other.cap_ = kInline;
    } else {
      std::copy(other.inline_, other.inline_ + other.size_, inline_);
    }
    size_ = other.size_;
    other.size_ = 0;
  }
  void grow(size_type n) {
    const size_type cap = std::max<size_type>(n, 2 * static_cast<size_type>(cap_));
    auto* fresh = new std::int64_t[cap];
    std::copy(data_, data_ + size_, fresh);
    if (on_heap()) delete[] data_;
    data_ = fresh;
    cap_ = static_cast<std::uint32_t>(cap);
  }
  // Makes room for `n` dimensions at `pos`; returns the index of the first.
  size_type open(const_iterator pos, size_type n) {
    const auto at = static_cast<size_type>(pos - data_);
    reserve(size_ + n);
    std::copy_backward(data_ + at, data_ + size_, data_ + size_ + n);
    size_ += static_cast<std::uint32_t>(n);
    return at;
  }

  std::int64_t* data_ = inline_;
  std::uint32_t size_ = 0;
  std::uint32_t cap_ = kInline;
  std::int64_t inline_[kInline];
};

}  // namespace graphward
